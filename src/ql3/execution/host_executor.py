"""The host executor: one process per worker home that keeps time for the attempts running there.

It runs in a session of its own (``DeadlineBoard.ensure_executor``), so a ``kill -9``, a freeze
(SIGSTOP) or a network cut of the serving or networking process does not stop it; it needs neither
the control plane nor the database. For every attempt on the deadline board (``deadlines.py``) it
holds a pidfd of the attempt's shim and the attempt's two deadlines on the host clock, and when one
passes it writes the ``.fired`` marker (why) and then stops the identity-proven process group:
TERM, the task's grace, KILL (``controller.ProcessController``), each due attempt in a thread of its
own, so that eight attempts due in one second are stopped in that second.

It sleeps in ``epoll`` until the earliest deadline, a line on its FIFO, the exit of a shim it
watches, or the exit of its owner (the worker process): never a poll. It exits when its owner is gone
(or said ``q``) and nothing it guards still runs. A ``kill -9`` of the executor loses nothing: the
board's files hold every deadline, and the next executor (the worker starts one when it finds none)
stops at once whatever is past due. docs/reliability.md, "Time".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ql3.execution.controller import ProcessController, kill_orphans
from ql3.execution.deadlines import (
    DEADLINE_SUFFIX,
    FIRED_SUFFIX,
    LOCK_FILE,
    WAKE_FIFO,
    DeadlineEntry,
    StopCause,
    host_clock_ms,
    read_small,
    valid_attempt_id,
    write_private,
)
from ql3.execution.identity import InvalidHandle, ProcessHandle, read_boot_id, verify_identity

MAX_ENTRIES: Final = 2048
MAX_LINES_PER_WAKE: Final = 4096
_log = logging.getLogger("ql3.executor")


@dataclass(slots=True)
class _Watched:
    entry: DeadlineEntry
    pid: int
    pidfd: int
    firing: bool = False


class HostExecutor:
    def __init__(
        self, directory: Path, *, owner_pid: int | None = None, controller: ProcessController | None = None
    ) -> None:
        self.directory = directory
        self._owner_pid = owner_pid
        self._controller = controller or ProcessController()
        self._boot_id = read_boot_id()
        self._watched: dict[str, _Watched] = {}
        self._by_fd: dict[int, str] = {}
        self._owner_fd: int | None = None
        self._owner_left = False
        self._poll = select.epoll()
        self._fifo_fd = -1
        self._buffer = b""
        self._threads: list[threading.Thread] = []

    # -- start -----------------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """The lock of this directory, or None when another executor holds it."""
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def open_fifo(self) -> None:
        fifo = self.directory / WAKE_FIFO
        with contextlib.suppress(FileExistsError):
            os.mkfifo(fifo, 0o600)
        # Read-write: the FIFO never reports end-of-file while we hold the write end ourselves.
        self._fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        self._poll.register(self._fifo_fd, select.EPOLLIN)

    def load_all(self) -> None:
        """Every entry on the board (bounded), as a restarted executor finds them."""
        names = sorted(os.listdir(self.directory))[: MAX_ENTRIES * 2]
        for name in names:
            if name.endswith(DEADLINE_SUFFIX):
                self.reload(name[: -len(DEADLINE_SUFFIX)])

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        lock = self.acquire()
        if lock is None:
            return 0  # another executor keeps this board
        try:
            self.open_fifo()
            if self._owner_pid is not None:
                self._set_owner(self._owner_pid)
            self.load_all()
            while not self.finished():
                self.cycle()
            return 0
        finally:
            for t in self._threads:
                t.join(timeout=310)
            os.close(lock)

    def finished(self) -> bool:
        return (self._owner_fd is None or self._owner_left) and not self._watched and self._fifo_empty()

    def _fifo_empty(self) -> bool:
        try:
            data = os.read(self._fifo_fd, 65536)
        except BlockingIOError:
            return True
        self._take_lines(data)
        return False

    def cycle(self, max_wait_ms: int | None = None) -> None:
        """Fire what is due, then sleep until the next deadline or event (``max_wait_ms`` caps it)."""
        now = host_clock_ms()
        self.fire_due(now)
        due = self.next_due_ms()
        timeout = None if due is None else max(0.0, (due - now) / 1000)
        if max_wait_ms is not None:
            timeout = max_wait_ms / 1000 if timeout is None else min(timeout, max_wait_ms / 1000)
        if (self._owner_fd is None or self._owner_left) and not self._watched:
            timeout = 0.0 if timeout is None else min(timeout, 0.05)
        for fd, _ in self._poll.poll(-1 if timeout is None else timeout):
            if fd == self._fifo_fd:
                self._read_fifo()
            elif fd == self._owner_fd:
                self._owner_gone()
            elif fd in self._by_fd:
                self._shim_exited(self._by_fd[fd])
        self._threads = [t for t in self._threads if t.is_alive()]

    def next_due_ms(self) -> int | None:
        due = [w.entry.due_at_ms() for w in self._watched.values() if not w.firing]
        known = [d for d in due if d is not None]
        return min(known) if known else None

    def fire_due(self, now_ms: int) -> list[str]:
        """Start a stop for every attempt past one of its deadlines; the ids stopped."""
        fired: list[str] = []
        for attempt_id, watched in list(self._watched.items()):
            if watched.firing:
                continue
            cause = watched.entry.cause_at(now_ms)
            if cause is None:
                continue
            watched.firing = True
            self._mark_fired(attempt_id, cause, now_ms)
            thread = threading.Thread(
                target=self._stop, args=(watched, cause), name=f"ql3-exec-stop-{attempt_id[:8]}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
            fired.append(attempt_id)
        return fired

    def _mark_fired(self, attempt_id: str, cause: StopCause, now_ms: int) -> None:
        """The marker comes first: a receipt written after our signal always finds it."""
        path = self.directory / f"{attempt_id}{FIRED_SUFFIX}"
        if read_small(path) is not None:
            return  # fired before a restart of ours: the first cause stands
        try:
            write_private(path, json.dumps({"cause": cause, "atMs": now_ms}))
        except OSError as exc:  # a full disk: enforce anyway, the cause is then unknown
            _log.warning("fired marker not written: %s", type(exc).__name__)

    def _stop(self, watched: _Watched, cause: StopCause) -> None:
        try:
            began = time.monotonic()
            outcome = self._controller.stop(
                watched.entry.handle, watched.pid, grace_ms=watched.entry.grace_ms
            )
            if outcome.status in ("termination_requested", "already_exited") and not outcome.kill_signal_sent:
                self._sweep_survivors(watched.entry, began)
            _log.warning(
                "stopped attempt %s (%s): %s term=%s kill=%s",
                watched.entry.attempt_id,
                cause,
                outcome.status,
                outcome.term_signal_sent,
                outcome.kill_signal_sent,
            )
        except Exception as exc:  # one attempt never stops the executor
            _log.warning("stop of %s failed: %s", watched.entry.attempt_id, type(exc).__name__)

    def _sweep_survivors(self, entry: DeadlineEntry, began: float) -> None:
        """The leader died of the TERM, but a member that ignored it may live on in the group: the
        shim is not our child, so once it is reaped nothing pins the group id, and ``stop`` sees the
        group gone. After the rest of the grace, whatever still descends from this attempt (proven by
        identity, ``controller.kill_orphans``) gets the KILL."""
        try:
            handle = ProcessHandle.decode(entry.handle)
        except InvalidHandle:
            return
        remaining = entry.grace_ms / 1000 - (time.monotonic() - began)
        if remaining > 0:
            time.sleep(remaining)
        try:
            if verify_identity(handle) != "exited":
                return  # the leader lives on (or is not provably it): stop's own rules decided
        except OSError:
            return
        killed = kill_orphans(handle)
        if killed:
            _log.warning("killed %d survivors of attempt %s", killed, entry.attempt_id)

    # -- events ----------------------------------------------------------------------------------

    def _read_fifo(self) -> None:
        try:
            data = os.read(self._fifo_fd, 65536)
        except BlockingIOError:
            return
        self._take_lines(data)

    def _take_lines(self, data: bytes) -> None:
        self._buffer += data
        lines = self._buffer.split(b"\n")
        self._buffer = lines.pop()[-256:]
        for raw in lines[-MAX_LINES_PER_WAKE:]:
            self._take(raw.decode("ascii", "replace").strip())

    def _take(self, line: str) -> None:
        kind, _, arg = line.partition(" ")
        if kind == "r" and valid_attempt_id(arg):
            self.reload(arg)
        elif kind == "o" and arg.isdigit():
            self._set_owner(int(arg))
        elif kind == "q":
            self._owner_left = True

    def _set_owner(self, pid: int) -> None:
        if self._owner_fd is not None:
            self._poll.unregister(self._owner_fd)
            os.close(self._owner_fd)
            self._owner_fd = None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self._owner_left = True  # already gone
            return
        self._owner_fd = fd
        self._owner_left = False
        self._poll.register(fd, select.EPOLLIN)

    def _owner_gone(self) -> None:
        assert self._owner_fd is not None
        self._poll.unregister(self._owner_fd)
        os.close(self._owner_fd)
        self._owner_fd = None
        self._owner_left = True

    def reload(self, attempt_id: str) -> None:
        """Re-read one attempt's entry: new, moved, or gone."""
        text = read_small(self.directory / f"{attempt_id}{DEADLINE_SUFFIX}")
        entry: DeadlineEntry | None = None
        if text is not None:
            try:
                entry = DeadlineEntry.from_json(text)
            except ValueError:
                entry = None
        current = self._watched.get(attempt_id)
        if entry is None or entry.attempt_id != attempt_id or entry.boot_id != self._boot_id:
            if current is not None and not current.firing:
                self._drop(attempt_id)
            if entry is not None and entry.boot_id != self._boot_id:
                self._remove_file(attempt_id)  # a previous boot's: every process of it is gone
            return
        if current is not None:
            if current.entry.handle == entry.handle:
                current.entry = entry
                return
            self._drop(attempt_id)
        if len(self._watched) >= MAX_ENTRIES:
            _log.warning("board full: %s not watched", attempt_id)
            return
        self._watch(entry)

    def _watch(self, entry: DeadlineEntry) -> None:
        try:
            handle = ProcessHandle.decode(entry.handle)
        except InvalidHandle:
            self._remove_file(entry.attempt_id)
            return
        try:
            pidfd = os.pidfd_open(handle.pid)
        except OSError:
            self._remove_file(entry.attempt_id)  # no such process: it has exited
            return
        # The pidfd is opened first, so a matching identity proves it is the handle's process.
        try:
            verdict = verify_identity(handle)
        except OSError:
            verdict = "exited"
        if verdict != "match":
            os.close(pidfd)
            if verdict == "exited":
                self._remove_file(entry.attempt_id)
            return
        self._watched[entry.attempt_id] = _Watched(entry=entry, pid=handle.pid, pidfd=pidfd)
        self._by_fd[pidfd] = entry.attempt_id
        self._poll.register(pidfd, select.EPOLLIN)

    def _shim_exited(self, attempt_id: str) -> None:
        self._drop(attempt_id)
        self._remove_file(attempt_id)

    def _drop(self, attempt_id: str) -> None:
        watched = self._watched.pop(attempt_id, None)
        if watched is None:
            return
        self._by_fd.pop(watched.pidfd, None)
        self._poll.unregister(watched.pidfd)
        os.close(watched.pidfd)

    def _remove_file(self, attempt_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / f"{attempt_id}{DEADLINE_SUFFIX}")

    @property
    def watched(self) -> dict[str, DeadlineEntry]:
        return {k: w.entry for k, w in self._watched.items()}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m ql3.execution.host_executor DIRECTORY OWNER_PID", file=sys.stderr)
        return 64
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s ql3-executor %(message)s"))
    _log.addHandler(handler)
    _log.setLevel(logging.WARNING)
    _log.propagate = False  # one line an event, whatever handlers an import may have set
    directory = Path(argv[0])
    if not directory.is_dir():
        print(f"ql3-executor: {directory} is not a directory", file=sys.stderr)
        return 64
    os.umask(0o077)
    return HostExecutor(directory, owner_pid=int(argv[1])).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
