"""One watcher thread reaps every shim, reports each exit once, and sleeps while idle."""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path

import pytest

from ql3.execution.launcher import ExitWatcher, LocalLauncher
from ql3.ports.execution import LaunchRequest, ShellCommand
from tests.support.processes import ExecHarness
from tests.support.waits import wait_for


def _watcher_thread() -> threading.Thread:
    threads = [t for t in threading.enumerate() if t.name == "ql3-exit-watcher"]
    assert len(threads) == 1
    return threads[0]


def _context_switches(thread: threading.Thread) -> int:
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)


def test_every_exit_is_reported_exactly_once_and_every_shim_is_reaped(tmp_path: Path) -> None:
    # Given a watcher and a burst of short attempts
    reported: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def on_exit(attempt_id: str) -> None:
        with lock:
            reported[attempt_id] += 1

    watcher = ExitWatcher(on_exit)
    watcher.start()
    launcher = LocalLauncher()
    pids = []
    try:
        for i in range(30):
            launched = launcher.start(_request(tmp_path, f"att-{i}", "exit 0" if i % 2 else "echo out"))
            pids.append(launched.pid)
            watcher.watch(launched)

        # When they have all finished
        assert wait_for(lambda: watcher.pending == 0)
    finally:
        watcher.stop()

    # Then each was reported once, none is left as our zombie, and no receipt temp file remains
    assert reported == {f"att-{i}": 1 for i in range(30)}
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert [p for p in os.listdir(tmp_path / "receipts") if p.endswith(".tmp")] == []


def test_an_idle_watcher_blocks_without_waking_up(ex: ExecHarness) -> None:
    # Given a started watcher with nothing to watch
    thread = _watcher_thread()
    wchan = Path(f"/proc/self/task/{thread.native_id}/wchan")
    assert wait_for(lambda: "epoll" in wchan.read_text())
    before = _context_switches(thread)

    # When time passes
    time.sleep(0.3)

    # Then its thread was never scheduled: no polling loop
    assert _context_switches(thread) == before


def test_a_failing_callback_is_reported_and_does_not_stop_the_watcher(tmp_path: Path) -> None:
    # Given a callback that fails for the first attempt
    errors: list[BaseException] = []
    done = threading.Event()

    def on_exit(attempt_id: str) -> None:
        if attempt_id == "att-bad":
            raise RuntimeError("callback failed")
        done.set()

    watcher = ExitWatcher(on_exit, on_error=errors.append)
    watcher.start()
    launcher = LocalLauncher()
    try:
        # When two attempts exit one after the other
        watcher.watch(launcher.start(_request(tmp_path, "att-bad", "true")))
        assert wait_for(lambda: watcher.pending == 0)
        watcher.watch(launcher.start(_request(tmp_path, "att-good", "true")))

        # Then the error went to on_error and the second exit was still reported
        assert done.wait(15)
    finally:
        watcher.stop()
    assert [str(e) for e in errors] == ["callback failed"]


def test_watch_requires_a_running_watcher_and_start_is_explicit(tmp_path: Path) -> None:
    watcher = ExitWatcher(lambda _: None)
    launcher = LocalLauncher()
    launched = launcher.start(_request(tmp_path, "att-x", "true"))
    try:
        with pytest.raises(RuntimeError):
            watcher.watch(launched)
        assert not [t for t in threading.enumerate() if t.name == "ql3-exit-watcher"]
        watcher.start()
        with pytest.raises(RuntimeError):
            watcher.start()
        watcher.stop()
        assert not [t for t in threading.enumerate() if t.name == "ql3-exit-watcher"]
        with pytest.raises(RuntimeError):
            watcher.watch(launched)
    finally:
        os.close(launched.pidfd)
        os.waitpid(launched.pid, 0)


def _request(root: Path, attempt_id: str, command: str) -> LaunchRequest:
    return LaunchRequest(
        run_id="run-1",
        attempt_id=attempt_id,
        command=ShellCommand(command=command),
        working_directory=None,
        environment_policy="isolated",
        environment={},
        callback_token="k" * 43,
        callback_sequence=1,
        log_path=root / "logs" / f"{attempt_id}.log",
        receipt_dir=root / "receipts",
        log_cap_bytes=1 << 20,
        started_at_ms=1,
    )
