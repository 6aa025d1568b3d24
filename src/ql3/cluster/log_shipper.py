"""The remote worker's log shipper (docs/cluster.md "Log shipping").

One thread tails the local log file of each attempt this worker runs (``logs/<attempt id>.log``) and
ships what was appended, in chunks of at most 64 KiB, to ``POST /api/v1/worker/logs`` with the
worker's credential and its current session. Shipping is idempotent by offset: a chunk whose
response was lost is sent again with the same bytes (a replay on the server); a gap or an overlap
answers with the stored length, which the shipper resumes from. When the attempt settles the rest of
the file is shipped and the log closed (``final``), so followers stop; the file is still tailed for
``linger_s`` afterwards (background children of a command may write a last line), then forgotten.

Bounded: at most ``MAX_TRACKED`` attempts, one pending chunk each, ``MAX_CHUNKS_PER_CYCLE`` chunks
per attempt per cycle. No busy loop: while something is tracked the thread wakes every ``tick_s``
(or at once when an attempt settles, or when a cycle left data behind); idle, it sleeps until an
attempt is tracked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from ql3.application.attempt_logs import MAX_CHUNK_BYTES, LogGap, LogOverlap
from ql3.cluster.http_control_plane import LogAck
from ql3.domain.errors import FenceConflict, Ql3Error
from ql3.execution.logs import log_path_for
from ql3.ports.control_plane import ControlPlaneUnreachable, SessionInfo

log = logging.getLogger("ql3.worker.logs")
MAX_TRACKED: Final = 1024
MAX_CHUNKS_PER_CYCLE: Final = 16  # 1 MiB per attempt per cycle
TICK_S: Final = 0.25
LINGER_S: Final = 10.0
# An attempt whose log keeps being refused or unreachable is retried on each tick; past this many
# consecutive failures after it settled it is forgotten (its log stays whole on this host).
MAX_FAILURES_SETTLED: Final = 240
# An offer refused before it was launched never settles: without a log file for this long, it goes.
UNLAUNCHED_FORGET_S: Final = 120.0


class LogSink(Protocol):
    def ship_log(
        self, session: SessionInfo, *, attempt_id: str, offset: int, data: bytes, final: bool
    ) -> LogAck: ...


@dataclass(slots=True)
class _Tail:
    attempt_id: str
    offset: int = 0  # the next byte of the file to ship (what the server has stored)
    pending: bytes | None = None  # a chunk sent without an answer: resent identically
    tracked_at: float = 0.0
    settled_at: float | None = None
    closed: bool = False
    failures: int = 0
    seen_file: bool = False
    busy: bool = False  # the shipper's thread is shipping it (under the shipper's lock)
    handed: bool = False  # its last chunk travels with the attempt's completion (take_final)


class LogShipper:
    def __init__(
        self,
        sink: LogSink,
        logs_dir: Path,
        session: Callable[[], SessionInfo | None],
        *,
        chunk_bytes: int = MAX_CHUNK_BYTES,
        tick_s: float = TICK_S,
        linger_s: float = LINGER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError("chunk_bytes out of range")
        self._sink = sink
        self._logs_dir = logs_dir
        self._session = session
        self._chunk = chunk_bytes
        self._tick_s = tick_s
        self._linger_s = linger_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tails: dict[str, _Tail] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the worker tells it ------------------------------------------------------------------

    def track(self, attempt_id: str) -> None:
        """Start tailing an attempt's log (again: a no-op)."""
        with self._lock:
            if attempt_id in self._tails:
                return
            if len(self._tails) >= MAX_TRACKED:
                self._evict_one()
            self._tails[attempt_id] = _Tail(attempt_id=attempt_id, tracked_at=self._clock())
        self._wake.set()

    def settled(self, attempt_id: str) -> None:
        """The attempt settled: ship the rest and close the log now (never blocks)."""
        with self._lock:
            tail = self._tails.get(attempt_id)
            if tail is None:
                if len(self._tails) >= MAX_TRACKED:
                    self._evict_one()
                tail = self._tails[attempt_id] = _Tail(attempt_id=attempt_id, tracked_at=self._clock())
            if tail.settled_at is None:
                tail.settled_at = self._clock()
        self._wake.set()

    def _evict_one(self) -> None:
        """Make room: the settled attempt that settled first goes (its log stays on this host)."""
        settled = [t for t in self._tails.values() if t.settled_at is not None]
        victim = (
            min(settled, key=lambda t: t.settled_at or 0.0) if settled else next(iter(self._tails.values()))
        )
        del self._tails[victim.attempt_id]

    def take_final(self, attempt_id: str) -> tuple[int, bytes] | None:
        """The rest of a finished attempt's log, when it fits one chunk and nothing of it is in
        flight: (offset, bytes), handed to the attempt's completion so both travel in one request
        and one transaction (docs/cluster.md "Log shipping"). Until ``final_answer`` the shipper
        leaves this log alone. None: the shipper closes the log itself after the completion."""
        with self._lock:
            tail = self._tails.get(attempt_id)
            if tail is None or tail.busy or tail.handed or tail.closed or tail.pending is not None:
                return None
            tail.handed = True
        data = self._read(tail)
        if data is None or len(data) >= self._chunk:
            self.final_answer(attempt_id, None)
            return None
        return tail.offset, data

    def final_answer(self, attempt_id: str, ack: LogAck | Ql3Error | None, *, shipped: int = 0) -> None:
        """What became of a chunk ``take_final`` handed out (``shipped`` bytes of it): stored (the log
        is closed), refused (the shipper resumes from what the server holds) or unknown (None: the
        shipper sends it again itself)."""
        with self._lock:
            tail = self._tails.get(attempt_id)
            if tail is None or not tail.handed:
                return
            tail.handed = False
            if isinstance(ack, LogAck):
                tail.offset += shipped
                tail.failures = 0
                if ack.truncated or ack.closed:
                    tail.closed = True
            elif isinstance(ack, LogGap | LogOverlap):
                tail.offset = int(ack.details.get("stored_bytes", tail.offset))
            elif isinstance(ack, FenceConflict):
                del self._tails[attempt_id]  # not this session's attempt: nothing it sends is taken
        self._wake.set()

    @property
    def tracked(self) -> list[str]:
        with self._lock:
            return list(self._tails)

    # -- the thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ql3-logs", daemon=True)
        self._thread.start()

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait (bounded) until every settled attempt's log is closed on the server: a worker that
        stops after draining sends its last logs first."""
        deadline = self._clock() + timeout_s
        while True:
            with self._lock:
                open_logs = [t for t in self._tails.values() if t.settled_at is not None and not t.closed]
            if not open_logs:
                return True
            remaining = deadline - self._clock()
            if remaining <= 0 or self._stopping.is_set():
                return False
            self._stopping.wait(min(self._tick_s, remaining))

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                idle = not self._tails
            # Idle: sleep until an attempt is tracked. Active: a short timer, or at once.
            self._wake.wait(None if idle else self._tick_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                if self.ship_once():
                    self._wake.set()  # data was left behind: go on without waiting
            except Exception as exc:  # the shipper must outlive any one failure
                log.warning(
                    "log shipping failed", extra={"action": "worker.logs_failed", "error": type(exc).__name__}
                )

    def ship_once(self) -> bool:
        """One cycle over every tracked attempt; True when some file had more than one cycle's worth."""
        session = self._session()
        if session is None:
            return False
        with self._lock:
            tails = list(self._tails.values())
        more = False
        for tail in tails:
            with self._lock:
                if tail.handed:
                    continue  # its last chunk travels with the completion
                tail.busy = True
            try:
                more = self._ship_tail(session, tail) or more
            finally:
                with self._lock:
                    tail.busy = False
            if self._done(tail):
                with self._lock:
                    if self._tails.get(tail.attempt_id) is tail:
                        del self._tails[tail.attempt_id]
        return more

    def _done(self, tail: _Tail) -> bool:
        if tail.settled_at is None:
            return not tail.seen_file and self._clock() - tail.tracked_at >= UNLAUNCHED_FORGET_S
        if tail.closed and self._clock() - tail.settled_at >= self._linger_s:
            return True
        return tail.failures >= MAX_FAILURES_SETTLED

    def _ship_tail(self, session: SessionInfo, tail: _Tail) -> bool:
        settled = tail.settled_at is not None  # read once: everything up to here was written before it
        for _ in range(MAX_CHUNKS_PER_CYCLE):
            data = tail.pending if tail.pending is not None else self._read(tail)
            if data is None:
                return False
            final = settled and not tail.closed and len(data) < self._chunk
            if not data and not final:
                return False  # nothing new
            tail.pending = data
            try:
                ack = self._sink.ship_log(
                    session, attempt_id=tail.attempt_id, offset=tail.offset, data=data, final=final
                )
            except (LogGap, LogOverlap) as exc:
                tail.pending = None
                tail.offset = int(exc.details.get("stored_bytes", tail.offset))
                continue  # resume from what the server holds
            except FenceConflict:
                self._forget(tail)  # not this session's attempt (any more): nothing it sends is taken
                return False
            except (ControlPlaneUnreachable, Ql3Error) as exc:
                tail.failures += 1
                if tail.failures in (1, 20):
                    log.info(
                        "log chunk not shipped", extra={"action": "worker.logs_retry", "error": exc.code}
                    )
                return False
            tail.failures = 0
            tail.pending = None
            tail.offset += len(data)
            if ack.truncated:
                tail.closed = True  # the quota is reached: nothing more is stored
                self._forget(tail)
                return False
            if final or ack.closed:
                tail.closed = True
            if final or len(data) < self._chunk:
                return False
        return True

    def _forget(self, tail: _Tail) -> None:
        with self._lock:
            if self._tails.get(tail.attempt_id) is tail:
                del self._tails[tail.attempt_id]

    def _read(self, tail: _Tail) -> bytes | None:
        """The next chunk of the file from the shipped offset; None when the file cannot be read."""
        try:
            path = log_path_for(self._logs_dir, tail.attempt_id)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""  # not launched yet, or never: an empty log
        except (OSError, Ql3Error):
            return None
        tail.seen_file = True
        try:
            return os.pread(fd, self._chunk, tail.offset)
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
