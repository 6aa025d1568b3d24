"""The host executor with real processes (execution/host_executor.py, docs/reliability.md "Time"): it
stops an identity-proven process group at its timeout or its local fence deadline by its own clock,
in parallel, survives a kill -9 of itself through the board's files, and exits when its owner is gone
and nothing it guards still runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.execution.controller import pidfds_supported
from ql3.execution.deadlines import DeadlineBoard, host_clock_ms
from ql3.execution.identity import capture

pytestmark = pytest.mark.skipif(not pidfds_supported(), reason="needs Linux pidfds")


class Commands:
    """Process groups of ``sh`` that ignore TERM (so a stop needs the KILL) or exit on it."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, attempt_id: str, *, ignore_term: bool = False) -> tuple[subprocess.Popen[bytes], str]:
        script = "trap '' TERM; sleep 60 & wait; sleep 60" if ignore_term else "exec sleep 60"
        proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
        self.procs.append(proc)
        handle = capture(proc.pid, attempt_id).encode()
        return proc, handle

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def commands() -> Iterator[Commands]:
    c = Commands()
    yield c
    c.close()


@pytest.fixture
def board(tmp_path: Path) -> Iterator[DeadlineBoard]:
    b = DeadlineBoard(tmp_path / "executor")
    b.start()
    yield b
    b.release()
    _kill_executor(b)


def _executor_pid(board: DeadlineBoard) -> int | None:
    out = subprocess.run(
        ["pgrep", "-f", f"ql3.execution.host_executor {board.directory} "], capture_output=True, text=True
    )
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if pids else None


def _kill_executor(board: DeadlineBoard) -> None:
    pid = _executor_pid(board)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ended_within(proc: subprocess.Popen[bytes], seconds: float) -> float | None:
    """The monotonic time at which ``proc`` ended, or None if it still runs after ``seconds``."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic()


def _monotonic_at(host_ms: int) -> float:
    """A host-clock instant on ``time.monotonic``'s scale (both tick together while nothing suspends)."""
    return time.monotonic() + (host_ms - host_clock_ms()) / 1000


def test_a_timeout_stops_the_group_on_time_and_says_why(board: DeadlineBoard, commands: Commands) -> None:
    proc, handle = commands.start("att-timeout")
    due = host_clock_ms() + 400
    board.arm("att-timeout", handle, timeout_at_ms=due, fence_at_ms=None, grace_ms=1_000)
    ended = _ended_within(proc, 10)
    assert ended is not None
    assert ended >= _monotonic_at(due) - 0.05
    assert ended - _monotonic_at(due) < 1.0
    assert proc.returncode == -signal.SIGTERM
    assert board.fired("att-timeout") == "timeout"


def test_a_fence_deadline_stops_the_group_with_kill_after_the_grace(
    board: DeadlineBoard, commands: Commands
) -> None:
    proc, handle = commands.start("att-fence", ignore_term=True)
    due = host_clock_ms() + 300
    board.arm("att-fence", handle, timeout_at_ms=None, fence_at_ms=due, grace_ms=500)
    ended = _ended_within(proc, 10)
    assert ended is not None
    # TERM is ignored: the group dies of the KILL, no sooner than the grace after the deadline.
    assert ended - _monotonic_at(due) >= 0.45
    assert ended - _monotonic_at(due) < 1.5
    assert proc.returncode == -signal.SIGKILL
    assert board.fired("att-fence") == "fence"


def test_a_renewal_moves_the_fence_and_the_group_runs_on(board: DeadlineBoard, commands: Commands) -> None:
    proc, handle = commands.start("att-renewed")
    board.arm("att-renewed", handle, timeout_at_ms=None, fence_at_ms=host_clock_ms() + 500, grace_ms=100)
    board.move_fence("att-renewed", host_clock_ms() + 60_000)
    assert _ended_within(proc, 1.5) is None
    assert board.fired("att-renewed") is None
    # A fence never moves backwards (a late answer of an older renewal).
    board.move_fence("att-renewed", host_clock_ms() + 100)
    assert _ended_within(proc, 0.8) is None
    board.disarm("att-renewed")
    assert not (board.directory / "att-renewed.deadline").exists()


def test_eight_due_attempts_are_stopped_within_the_same_second(
    board: DeadlineBoard, commands: Commands
) -> None:
    due = host_clock_ms() + 600
    started = [commands.start(f"att-{i}", ignore_term=True) for i in range(8)]
    for i, (_, handle) in enumerate(started):
        board.arm(f"att-{i}", handle, timeout_at_ms=None, fence_at_ms=due, grace_ms=300)
    ends = [_ended_within(proc, 10) for proc, _ in started]
    assert all(e is not None for e in ends)
    finished = [e for e in ends if e is not None]
    # Each waited out its own 300 ms grace in parallel: all dead within one second of the deadline.
    assert max(finished) - _monotonic_at(due) < 1.0
    assert all(board.fired(f"att-{i}") == "fence" for i in range(8))


def test_a_killed_executor_is_replaced_and_stops_what_is_past_due_at_once(
    board: DeadlineBoard, commands: Commands
) -> None:
    proc, handle = commands.start("att-orphan")
    due = host_clock_ms() + 500
    board.arm("att-orphan", handle, timeout_at_ms=due, fence_at_ms=None, grace_ms=200)
    _kill_executor(board)
    time.sleep(1.0)  # the deadline passes while no executor runs
    assert proc.poll() is None
    assert board.ensure_executor()  # what the worker's maintenance does on its next pass
    ended = _ended_within(proc, 10)
    assert ended is not None and proc.returncode == -signal.SIGTERM
    assert board.fired("att-orphan") == "timeout"


def test_the_executor_outlives_its_owner_while_it_guards_a_command(
    tmp_path: Path, commands: Commands
) -> None:
    """Its owner (here a child process standing for a worker) is killed with -9: the executor keeps
    the command's deadline, then exits once nothing is left to guard."""
    directory = tmp_path / "executor"
    proc, handle = commands.start("att-owned")
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ql3.execution.deadlines import DeadlineBoard, host_clock_ms\n"
        "b = DeadlineBoard(Path(sys.argv[1])); b.start()\n"
        "due = host_clock_ms() + 1500\n"
        "b.arm('att-owned', sys.argv[2], timeout_at_ms=due, fence_at_ms=None, grace_ms=200)\n"
        "print('armed', flush=True); time.sleep(60)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(directory), handle],
        stdout=subprocess.PIPE,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == b"armed"
        owner.kill()
        owner.wait()
        ended = _ended_within(proc, 10)
        assert ended is not None and proc.returncode == -signal.SIGTERM
        board = DeadlineBoard(directory, spawn_executor=False)
        assert board.fired("att-owned") == "timeout"
        deadline = time.monotonic() + 5
        while board.executor_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not board.executor_running()  # owner gone, nothing guarded: it exited
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


def test_an_entry_whose_process_is_gone_is_dropped_and_nothing_is_signalled(
    board: DeadlineBoard, commands: Commands
) -> None:
    proc, handle = commands.start("att-gone")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    board.arm("att-gone", handle, timeout_at_ms=host_clock_ms(), fence_at_ms=None, grace_ms=0)
    deadline = time.monotonic() + 5
    while (board.directory / "att-gone.deadline").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (board.directory / "att-gone.deadline").exists()
    assert board.fired("att-gone") is None


def test_a_member_that_ignores_the_term_dies_after_the_grace_when_its_leader_is_gone(
    board: DeadlineBoard, tmp_path: Path
) -> None:
    """The leader dies of the TERM and is reaped at once (as init reaps a re-adopted shim): nothing
    pins its group id any more, yet the member that ignored the TERM is found by its identity (its
    session, group and the attempt id in its environment) and gets the KILL once the grace is over."""
    pid_file = tmp_path / "survivor"
    survivor_cmd = f"exec sh -c 'echo $$ > {pid_file}; exec sleep 60'"
    script = f"(trap '' TERM; {survivor_cmd}) & exec sleep 60"
    env = {**os.environ, "QL3_ATTEMPT_ID": "att-survivor"}
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True, env=env)
    try:
        handle = capture(proc.pid, "att-survivor").encode()
        deadline = time.monotonic() + 5
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.02)
        survivor = int(pid_file.read_text())
        due = host_clock_ms() + 200
        board.arm("att-survivor", handle, timeout_at_ms=due, fence_at_ms=None, grace_ms=700)
        assert _ended_within(proc, 10) is not None  # the leader: TERM, reaped here at once
        termed = time.monotonic()
        gone_at = None
        while time.monotonic() - termed < 5:
            try:
                os.kill(survivor, 0)
            except ProcessLookupError:
                gone_at = time.monotonic()
                break
            time.sleep(0.02)
        assert gone_at is not None, "the member that ignored the TERM outlived its grace"
        # Not before the grace: it was given the whole of it (less the leader's own exit time).
        assert gone_at - _monotonic_at(due) >= 0.6
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
