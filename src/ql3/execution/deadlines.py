"""The deadline board: what the worker tells its host executor about each running attempt.

One directory per worker home (``<worker home>/executor``, mode 0700) holds:

- ``<attempt id>.deadline``: the attempt's process handle, its timeout deadline and its local fence
  deadline on the host clock (``host_clock_ms``), and its TERM -> KILL grace. The worker writes it
  (a temp file renamed over it, mode 0600) at the spawn and after every renewal; the executor reads it.
- ``<attempt id>.fired``: written by the executor *before* it signals the group, saying why
  (``timeout`` or ``fence``). The worker reads it when it settles the receipt (the completion's
  ``stop_cause``) and deletes it with the deadline once the completion is acknowledged.
- ``wake``: a FIFO (0600) on which the worker tells the executor to re-read one attempt's file
  (``r <attempt id>``), who its owner is (``o <pid>``), or that its owner stops (``q``).
- ``executor.lock``: held (flock) by the running executor: one executor per directory.

The files are the executor's durable state: a restarted executor re-reads them, a restarted worker
rewrites them. They are not fsynced: a host crash ends every process they describe.
See docs/reliability.md ("Time") and execution/host_executor.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ql3.execution.identity import read_boot_id

StopCause = Literal["timeout", "fence"]
DEADLINE_SUFFIX: Final = ".deadline"
FIRED_SUFFIX: Final = ".fired"
WAKE_FIFO: Final = "wake"
LOCK_FILE: Final = "executor.lock"
LOG_FILE: Final = "executor.log"
MAX_ENTRY_BYTES: Final = 4096
_EXECUTOR_MODULE: Final = "ql3.execution.host_executor"
_ATTEMPT_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_log = logging.getLogger("ql3.worker")


def host_clock_ms() -> int:
    """The host clock: ``CLOCK_BOOTTIME`` in ms (monotonic, counts suspension, one per boot)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


def valid_attempt_id(attempt_id: str) -> bool:
    return bool(_ATTEMPT_RE.fullmatch(attempt_id))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineEntry:
    """One attempt's deadlines on the host clock of boot ``boot_id``."""

    attempt_id: str
    boot_id: str
    handle: str
    timeout_at_ms: int | None
    fence_at_ms: int | None
    grace_ms: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": 1,
                "attemptId": self.attempt_id,
                "boot": self.boot_id,
                "handle": self.handle,
                "timeoutAtMs": self.timeout_at_ms,
                "fenceAtMs": self.fence_at_ms,
                "graceMs": self.grace_ms,
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str) -> DeadlineEntry:
        """Raises ValueError on anything but the exact shape."""
        raw: Any = json.loads(text)
        if not isinstance(raw, dict) or raw.get("v") != 1:
            raise ValueError("not a deadline entry")
        attempt_id, boot, handle = raw.get("attemptId"), raw.get("boot"), raw.get("handle")
        if not (isinstance(attempt_id, str) and valid_attempt_id(attempt_id)):
            raise ValueError("attempt id")
        if not (isinstance(boot, str) and isinstance(handle, str)):
            raise ValueError("boot or handle")
        grace = raw.get("graceMs")
        if type(grace) is not int or not 0 <= grace <= 300_000:
            raise ValueError("grace")
        return DeadlineEntry(
            attempt_id=attempt_id,
            boot_id=boot,
            handle=handle,
            timeout_at_ms=_opt_ms(raw.get("timeoutAtMs")),
            fence_at_ms=_opt_ms(raw.get("fenceAtMs")),
            grace_ms=grace,
        )

    def due_at_ms(self) -> int | None:
        due = [v for v in (self.timeout_at_ms, self.fence_at_ms) if v is not None]
        return min(due) if due else None

    def cause_at(self, now_ms: int) -> StopCause | None:
        """Why the attempt must stop at ``now_ms``, or None. A timeout wins a tie: it is the
        task's own rule, and its outcome (``timed_out``) is the one a user expects."""
        if self.timeout_at_ms is not None and self.timeout_at_ms <= now_ms:
            return "timeout"
        if self.fence_at_ms is not None and self.fence_at_ms <= now_ms:
            return "fence"
        return None


def _opt_ms(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ValueError("deadline")
    return value


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file renamed over it (mode 0600, never partial)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_small(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_ENTRY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_ENTRY_BYTES:
        return None
    return data.decode("utf-8", "replace")


def read_fired(directory: Path, attempt_id: str) -> StopCause | None:
    text = read_small(directory / f"{attempt_id}{FIRED_SUFFIX}")
    if text is None:
        return None
    try:
        cause = json.loads(text).get("cause")
    except (ValueError, AttributeError):
        return None
    return cause if cause in ("timeout", "fence") else None


class DeadlineBoard:
    """The worker's side of the board: arm, move the fence, read why it fired, disarm.

    Every method is cheap (one small file and one FIFO write) and never raises for an I/O failure:
    the board protects the run, it must not break the worker's own path. A failure is logged and
    counted in ``failures``; the executor then enforces what the board held last.
    """

    def __init__(self, directory: Path, *, spawn_executor: bool = True) -> None:
        self.directory = directory
        self._spawn = spawn_executor
        self._boot_id = read_boot_id()
        self._lock = threading.Lock()
        self._entries: dict[str, DeadlineEntry] = {}
        self._pid: int | None = None
        self._exited: set[int] = set()
        self._announced = False
        self.failures = 0

    # -- the executor ------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the directory and make sure an executor runs for it (started in its own session,
        so that a kill of the worker's process group or session leaves it running)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)
        fifo = self.directory / WAKE_FIFO
        try:
            os.mkfifo(fifo, 0o600)
        except FileExistsError:
            pass
        self.ensure_executor()

    def executor_running(self) -> bool:
        """True while some process holds the executor lock of this directory."""
        try:
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EAGAIN, errno.EACCES)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def ensure_executor(self) -> bool:
        """Start the executor when none runs; True when one was started. Reaps an exited one of ours."""
        if not self._spawn:
            return False
        with self._lock:
            if self.executor_running():
                if not self._announced:
                    # An executor left by our predecessor: we are its owner now.
                    self._send(f"o {os.getpid()}")
                    self._announced = True
                return False
            self._announced = True  # the new executor takes our pid from its command line
            self._pid = self._spawn_executor()
        self._wait_ready()
        return True

    def _spawn_executor(self) -> int:
        """``python -m ql3.execution.host_executor DIR OWNER`` in a new session, its output appended to
        the board's log; a daemon thread reaps it whenever it exits (it may outlive us: then init does)."""
        log_fd = os.open(
            self.directory / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600
        )
        try:
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-m", _EXECUTOR_MODULE, str(self.directory), str(os.getpid())],
                _executor_environment(),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                ],
                setsid=True,
            )
        finally:
            os.close(log_fd)
        threading.Thread(target=self._reap, args=(pid,), name="ql3-executor-reaper", daemon=True).start()
        return pid

    def _reap(self, pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self._exited.add(pid)

    def _wait_ready(self) -> None:
        """Until the new executor holds its lock (bounded: 5 s), so the first arm is not missed."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if self.executor_running():
                return
            if self._pid is not None and self._pid in self._exited:
                _log.warning("host executor exited at start", extra={"action": "executor.start_failed"})
                return
            time.sleep(0.01)

    def release(self) -> None:
        """The worker stops: the executor exits once nothing it guards still runs."""
        self._send("q")

    # -- entries -----------------------------------------------------------------------------------

    def arm(
        self,
        attempt_id: str,
        handle: str,
        *,
        timeout_at_ms: int | None,
        fence_at_ms: int | None,
        grace_ms: int,
    ) -> None:
        entry = DeadlineEntry(
            attempt_id=attempt_id,
            boot_id=self._boot_id,
            handle=handle,
            timeout_at_ms=timeout_at_ms,
            fence_at_ms=fence_at_ms,
            grace_ms=grace_ms,
        )
        self._store(entry)

    def move_fence(self, attempt_id: str, fence_at_ms: int) -> None:
        """A renewal succeeded: the fence moves to ``fence_at_ms`` (never backwards)."""
        with self._lock:
            entry = self._entries.get(attempt_id)
        if entry is None:
            entry = self._load(attempt_id)
            if entry is None:
                return
        if entry.fence_at_ms is not None and fence_at_ms <= entry.fence_at_ms:
            return
        self._store(
            DeadlineEntry(
                attempt_id=entry.attempt_id,
                boot_id=entry.boot_id,
                handle=entry.handle,
                timeout_at_ms=entry.timeout_at_ms,
                fence_at_ms=fence_at_ms,
                grace_ms=entry.grace_ms,
            )
        )

    def armed(self, attempt_id: str) -> bool:
        return self.entry(attempt_id) is not None

    def entry(self, attempt_id: str) -> DeadlineEntry | None:
        with self._lock:
            cached = self._entries.get(attempt_id)
        return cached if cached is not None else self._load(attempt_id)

    def fired(self, attempt_id: str) -> StopCause | None:
        """Why the executor stopped this attempt, if it did."""
        if not valid_attempt_id(attempt_id):
            return None
        return read_fired(self.directory, attempt_id)

    def disarm(self, attempt_id: str) -> None:
        """The attempt is settled: its deadline and its fired marker go."""
        if not valid_attempt_id(attempt_id):
            return
        with self._lock:
            self._entries.pop(attempt_id, None)
        for suffix in (DEADLINE_SUFFIX, FIRED_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / f"{attempt_id}{suffix}")
        self._send(f"r {attempt_id}")

    def _load(self, attempt_id: str) -> DeadlineEntry | None:
        if not valid_attempt_id(attempt_id):
            return None
        text = read_small(self.directory / f"{attempt_id}{DEADLINE_SUFFIX}")
        if text is None:
            return None
        try:
            entry = DeadlineEntry.from_json(text)
        except ValueError:
            return None
        with self._lock:
            self._entries[attempt_id] = entry
        return entry

    def _store(self, entry: DeadlineEntry) -> None:
        if not valid_attempt_id(entry.attempt_id):
            return
        try:
            write_private(self.directory / f"{entry.attempt_id}{DEADLINE_SUFFIX}", entry.to_json())
        except OSError as exc:
            self.failures += 1
            _log.warning(
                "deadline not written",
                extra={"action": "executor.deadline_write_failed", "error": type(exc).__name__},
            )
            return
        with self._lock:
            self._entries[entry.attempt_id] = entry
        self._send(f"r {entry.attempt_id}")

    def _send(self, message: str) -> None:
        """One line on the FIFO; nothing when no executor reads it (it re-reads every file at start)."""
        try:
            fd = os.open(self.directory / WAKE_FIFO, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            os.write(fd, f"{message}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)


def _executor_environment() -> dict[str, str]:
    """The executor needs only enough to import ql3: no server secrets travel to it."""
    keep = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env
