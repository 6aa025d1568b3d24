"""Noticing a replica that hangs (docs/cluster.md "Timings").

A replica that refuses connections is noticed at once; one that accepts them and never answers (a
frozen process, SIGSTOP, a stuck event loop) is noticed only by time. A short call is bounded by its
read timeout. A long-poll may rightly stay silent for its whole wait, so while one is in flight the
replica's ``/healthz`` is probed every ``PROBE_INTERVAL_S`` with ``PROBE_TIMEOUT_S``; a probe left
unanswered gives the long-poll up (``Unresponsive``) and the caller moves to the next replica. The
request given up keeps its thread until its own read timeout (every call of the protocol is
replay-safe: the next replica answers the same pull pair or stop query).

``last_answer_ms`` is the age of the replica's last answer (any call or probe), which is what the
worker logs when it moves, so the bound can be checked from its own log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Generic, TypeVar, cast

import httpx

T = TypeVar("T")

PROBE_INTERVAL_S: Final = 1.0
PROBE_TIMEOUT_S: Final = 2.0
# How long a worker goes without an answer from a hung replica before it moves on, at most: a probe
# is sent at most PROBE_INTERVAL_S after the last answer and waits PROBE_TIMEOUT_S; a short call waits
# its read timeout (http_control_plane.READ_TIMEOUT_S, 4 s) after an answer at most a probe interval
# old. One second of scheduling slack on a loaded host.
MOVE_BOUND_S: Final = 6.0


class _Call(Generic[T]):
    """One long-poll on a daemon thread of its own: a given-up one may block until its read timeout,
    and must never hold the process's exit (a pool's threads are joined at exit)."""

    def __init__(self, send: Callable[[], T]) -> None:
        self._send = send
        self.done = threading.Event()
        self.result: T | None = None
        self.ok = False
        self.error: Exception | None = None
        threading.Thread(target=self._run, name="ql3-long-poll", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._send()
            self.ok = True
        except (httpx.HTTPError, RuntimeError, OSError, ValueError) as exc:  # the waiting caller raises it
            self.error = exc
        finally:
            self.done.set()


class Unresponsive(Exception):
    """The replica answered neither the long-poll nor a liveness probe in time."""

    def __init__(self, silent_ms: int) -> None:
        super().__init__(f"no answer for {silent_ms} ms")
        self.silent_ms = silent_ms


class Liveness:
    """Per replica: when it last answered, and the probe that tells a quiet long-poll from a hang."""

    def __init__(self, client: httpx.Client, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._answered: dict[str, float] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def answered(self, server: str) -> None:
        with self._lock:
            self._answered[server] = self._clock()

    def silent_ms(self, server: str, since: float) -> int:
        """Milliseconds since the replica's last answer (since ``since`` when it never answered)."""
        with self._lock:
            last = self._answered.get(server, since)
        return int((self._clock() - last) * 1000)

    def probe(self, server: str) -> bool:
        """One ``GET /healthz`` with short timeouts: True when the replica answered at all."""
        try:
            self._client.get(
                f"{server}/healthz", timeout=httpx.Timeout(PROBE_TIMEOUT_S, connect=PROBE_TIMEOUT_S)
            )
        except httpx.HTTPError:
            return False
        self.answered(server)
        return True

    def long_poll(self, server: str, send: Callable[[], T]) -> T:
        """``send`` (one long-poll to ``server``) on a thread of its own; while it waits, the replica
        is probed every ``PROBE_INTERVAL_S``. Raises ``Unresponsive`` when a probe is not answered."""
        if self._closed.is_set():
            raise RuntimeError("closed")  # as the closed client would: the caller is shutting down
        started = self._clock()
        call = _Call(send)
        while not call.done.wait(PROBE_INTERVAL_S):
            if self._closed.is_set():
                raise RuntimeError("closed")
            if not self.probe(server):
                raise Unresponsive(self.silent_ms(server, started))
        if call.error is not None:
            raise call.error
        if not call.ok:
            raise RuntimeError("the long-poll failed")  # its thread reported the error itself
        self.answered(server)
        return cast(T, call.result)

    def close(self) -> None:
        self._closed.set()
