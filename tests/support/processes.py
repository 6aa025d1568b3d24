"""Real processes for the execution layer: a launcher with a running exit watcher, and /proc readers."""

from __future__ import annotations

import os
import secrets
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ql3.execution.launcher import ExitWatcher, Launched, LocalLauncher
from ql3.execution.receipts import Receipt, read_receipt, token_digest
from ql3.ports.execution import ArgvCommand, LaunchRequest, ShellCommand

PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2
DEADLINE_S = 15.0


def proc_stat_fields(pid: int) -> list[str] | None:
    """Fields after the comm of /proc/<pid>/stat (state first), or None when the pid is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(b")") + 2 :].decode().split()


def live_group_members(pgid: int) -> list[int]:
    """Pids of non-zombie processes in process group ``pgid`` (an independent /proc scan)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat_fields(int(name))
            if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X", "x"):
                members.append(int(name))
    return members


def group_comms(pgid: int) -> list[str]:
    """Command names of the live members of a process group."""
    comms = []
    for pid in live_group_members(pgid):
        try:
            comms.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return comms


def _status_mask(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(key)


def signal_pending(pid: int, sig: int) -> bool:
    bit = 1 << (sig - 1)
    return bool((_status_mask(pid, "ShdPnd") | _status_mask(pid, "SigPnd")) & bit)


def signal_ignored(pid: int, sig: int) -> bool:
    return bool(_status_mask(pid, "SigIgn") & (1 << (sig - 1)))


@dataclass
class ExecHarness:
    """One temp root, one launcher, one started exit watcher; every launched group is killed at teardown."""

    root: Path
    launcher: LocalLauncher
    watcher: ExitWatcher
    exited: dict[str, threading.Event]
    errors: list[BaseException]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    run_id: str = "run-0001"
    _pins: list[int] = field(default_factory=list)
    _unwatched: list[Launched] = field(default_factory=list)

    @property
    def receipts(self) -> Path:
        return self.root / "receipts"

    def log_path(self, attempt_id: str) -> Path:
        return self.root / "logs" / f"{attempt_id}.log"

    def request(
        self, attempt_id: str, command: ShellCommand | ArgvCommand, **overrides: Any
    ) -> LaunchRequest:
        values: dict[str, Any] = {
            "run_id": self.run_id,
            "attempt_id": attempt_id,
            "command": command,
            "working_directory": None,
            "environment_policy": "isolated",
            "environment": {},
            "callback_token": self.token,
            "callback_sequence": 1,
            "log_path": self.log_path(attempt_id),
            "receipt_dir": self.receipts,
            "log_cap_bytes": 1 << 20,
            "started_at_ms": 1_800_000_000_000,
        }
        values.update(overrides)
        return LaunchRequest(**values)

    def launch(
        self, attempt_id: str, command: ShellCommand | ArgvCommand, *, watch: bool = True, **overrides: Any
    ) -> Launched:
        self.exited[attempt_id] = threading.Event()
        launched = self.launcher.start(self.request(attempt_id, command, **overrides))
        self._pins.append(os.pidfd_open(launched.pid))
        if watch:
            self.watcher.watch(launched)
        else:
            self._unwatched.append(launched)  # the harness closes its pidfd and reaps it
        return launched

    def shell(self, attempt_id: str, command: str, **overrides: Any) -> Launched:
        return self.launch(attempt_id, ShellCommand(command=command), **overrides)

    def wait_exit(self, attempt_id: str) -> None:
        assert self.exited[attempt_id].wait(DEADLINE_S), "the shim did not exit in time"

    def receipt(self, attempt_id: str) -> Receipt | None:
        return read_receipt(
            self.receipts,
            attempt_id,
            expected_run_id=self.run_id,
            expected_sequence=1,
            expected_token_digest=token_digest(self.token),
        )

    def kill_everything(self) -> None:
        for pin in self._pins:
            try:
                signal.pidfd_send_signal(pin, signal.SIGKILL, None, PIDFD_SIGNAL_PROCESS_GROUP)
            except ProcessLookupError:
                pass
            os.close(pin)
        self._pins.clear()
        for launched in self._unwatched:
            os.close(launched.pidfd)
            try:
                os.waitpid(launched.pid, 0)
            except ChildProcessError:
                pass
        self._unwatched.clear()


def pid_state_and_group(pid: str) -> tuple[str, int] | None:
    """``(state, pgrp)`` of a process, from /proc/<pid>/stat (the comm field may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def processes_of_run(run_id: str) -> dict[int, int]:
    """pid -> pgrp of every live process whose environment carries ``QL3_RUN_ID=<run_id>``."""
    marker = f"QL3_RUN_ID={run_id}".encode()
    found: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker not in environ.split(b"\0"):
            continue
        stat = pid_state_and_group(pid)
        if stat is not None and stat[0] not in ("Z", "X"):
            found[int(pid)] = stat[1]
    return found
