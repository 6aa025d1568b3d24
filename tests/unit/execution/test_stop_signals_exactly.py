"""Stop delivers exactly the signals it reports, waits exactly its grace, and detects kernel support once.

Each case runs real processes; where a moment inside ``stop`` matters (the instant after the proof, the
clock of the grace) the test hooks that moment, as ``replaced_group_probe.py`` does.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ql3.execution import controller as controller_module
from ql3.execution.controller import (
    PIDFD_SIGNAL_PROCESS_GROUP,
    ProcessController,
    StopOutcome,
    finish_stop,
    is_group_alive,
    kill_orphans,
)
from ql3.execution.identity import MAX_PID, ProcessHandle, capture, classify, read_stat
from tests.support.processes import live_group_members, signal_ignored, signal_pending
from tests.support.waits import wait_for

MODES = pytest.mark.parametrize("group_signal_via_pidfd", [None, False], ids=["pidfd-group", "killpg"])
CATCHABLE = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP) and s < 32]

# Every catchable signal is blocked, so whatever reaches the process stays visible as pending.
_BLOCK_ALL = (
    "import signal, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


class Target:
    """A real process-group leader (own session), its genuine handle, and its Popen for reaping."""

    def __init__(self, argv: list[str], *, ready_line: bool, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True, env=env)
        assert self.proc.stdout is not None
        if ready_line:
            assert self.proc.stdout.readline() == b"ready\n"
        self.handle: ProcessHandle = capture(self.proc.pid, "att-exact")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def targets() -> Iterator[Callable[..., Target]]:
    made: list[Target] = []

    def make(argv: list[str], *, ready_line: bool = False, env: dict[str, str] | None = None) -> Target:
        made.append(Target(argv, ready_line=ready_line, env=env))
        return made[-1]

    yield make
    for target in made:
        target.close()


def _pending(pid: int) -> set[int]:
    return {sig for sig in CATCHABLE if signal_pending(pid, sig)}


@MODES
def test_stop_delivers_term_and_no_other_signal(
    targets: Callable[..., Target], group_signal_via_pidfd: bool | None
) -> None:
    # Given a leader that blocks every catchable signal, stopped with a long grace in the background
    target = targets([sys.executable, "-c", _BLOCK_ALL], ready_line=True)
    controller = ProcessController(group_signal_via_pidfd=group_signal_via_pidfd)
    outcomes: list[StopOutcome] = []
    stopper = threading.Thread(
        target=lambda: outcomes.append(
            controller.stop(target.handle.encode(), target.proc.pid, grace_ms=60_000, poll_ms=20)
        )
    )
    stopper.start()
    try:
        # When the TERM has arrived (the liveness re-checks run every 20 ms meanwhile)
        assert wait_for(lambda: signal_pending(target.proc.pid, signal.SIGTERM))
        pending = _pending(target.proc.pid)
    finally:
        os.kill(target.proc.pid, signal.SIGKILL)  # ends the stop: the group has no live member left
        stopper.join(30)

    # Then TERM is the only signal that ever reached it (the re-checks signal nothing)
    assert pending == {signal.SIGTERM}
    assert outcomes == [
        StopOutcome(status="termination_requested", term_signal_sent=True, kill_signal_sent=False)
    ]


@MODES
def test_an_unreaped_leader_with_no_live_member_ends_the_grace_without_kill(
    targets: Callable[..., Target], group_signal_via_pidfd: bool | None
) -> None:
    # Given a cooperative leader that nobody reaps: after TERM its group holds only its zombie
    target = targets(["/bin/sleep", "300"])

    # When it is stopped with a long grace
    outcome = ProcessController(group_signal_via_pidfd=group_signal_via_pidfd).stop(
        target.handle.encode(), target.proc.pid, grace_ms=60_000, poll_ms=20
    )

    # Then the zombie is no live member: the stop ends on TERM, and TERM is what ended the process
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=False
    )
    stat = read_stat(target.proc.pid)
    assert stat is not None and stat.state == "Z"
    assert target.proc.wait() == -signal.SIGTERM


def _leader_and_term_ignoring_member(targets: Callable[..., Target]) -> Target:
    """A leader that dies on TERM and a member that ignores TERM, with this attempt's id in their env."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "QL3_ATTEMPT_ID": "att-exact"}
    target = targets(["/bin/sh", "-c", "(trap '' TERM; exec sleep 300) & exec sleep 300"], env=env)

    def ready() -> bool:
        members = live_group_members(target.handle.pgid)
        return len(members) == 2 and any(signal_ignored(p, signal.SIGTERM) for p in members)

    assert wait_for(ready)
    return target


def test_killpg_fallback_once_the_leader_is_reaped_ends_the_stop_and_claims_no_kill(
    targets: Callable[..., Target],
) -> None:
    # Given a leader reaped as soon as it dies on TERM, and a member that ignores TERM
    target = _leader_and_term_ignoring_member(targets)
    pgid = target.handle.pgid
    reaper = threading.Thread(target=target.proc.wait)
    reaper.start()

    # When the killpg fallback stops it with a long grace
    outcome = ProcessController(group_signal_via_pidfd=False).stop(
        target.handle.encode(), target.proc.pid, grace_ms=60_000, poll_ms=20
    )
    reaper.join(30)

    # Then with the leader reaped nothing pins the group number: the stop ends, no KILL sent or claimed
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=False
    )
    (survivor,) = live_group_members(pgid)
    assert signal_ignored(survivor, signal.SIGTERM)
    # and the survivor is left to the orphan sweep, which finds it by identity
    assert kill_orphans(target.handle) == 1
    assert wait_for(lambda: live_group_members(pgid) == [])


def test_the_pidfd_group_signal_still_reaches_a_member_left_by_a_reaped_leader(
    targets: Callable[..., Target],
) -> None:
    # Given a leader reaped as soon as it dies on TERM, and a member that ignores TERM
    target = _leader_and_term_ignoring_member(targets)
    pgid = target.handle.pgid
    reaper = threading.Thread(target=target.proc.wait)
    reaper.start()

    # When the pidfd group signal stops it with a short grace
    outcome = ProcessController(group_signal_via_pidfd=True).stop(
        target.handle.encode(), target.proc.pid, grace_ms=300, poll_ms=20
    )
    reaper.join(30)

    # Then the pinned group was reached after the grace: the member got the KILL
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=True
    )
    assert wait_for(lambda: live_group_members(pgid) == [])
    assert target.proc.returncode == -signal.SIGTERM


@MODES
def test_a_leader_that_exits_right_after_its_proof_gets_no_term(
    targets: Callable[..., Target], group_signal_via_pidfd: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a live leader that exits and is reaped in the instant after stop verified it
    target = targets(["/bin/sleep", "300"])

    def classify_then_exit(*args: Any) -> Any:
        verdict = classify(*args)
        target.proc.kill()
        target.proc.wait()
        return verdict

    monkeypatch.setattr(controller_module, "classify", classify_then_exit)

    # When it is stopped, Then the TERM finds no group: already exited, nothing delivered
    outcome = ProcessController(group_signal_via_pidfd=group_signal_via_pidfd).stop(
        target.handle.encode(), target.proc.pid, grace_ms=0
    )
    assert outcome == StopOutcome(status="already_exited", term_signal_sent=False, kill_signal_sent=False)


class FakeClock:
    """The controller's clock: ``sleep`` only advances it; a runaway loop fails instead of spinning."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        assert len(self.sleeps) <= 200, f"the grace loop does not end: {self.sleeps[:5]}..."
        self.now += seconds


@MODES
def test_the_grace_is_waited_in_poll_steps_exactly_then_kill(
    targets: Callable[..., Target], group_signal_via_pidfd: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a leader that never reacts to TERM, and the controller on a fake clock
    target = targets([sys.executable, "-c", _BLOCK_ALL], ready_line=True)
    clock = FakeClock()
    monkeypatch.setattr(controller_module, "time", clock)

    # When it is stopped with a 1 s grace polled every 375 ms (binary-exact steps)
    outcome = ProcessController(group_signal_via_pidfd=group_signal_via_pidfd).stop(
        target.handle.encode(), target.proc.pid, grace_ms=1000, poll_ms=375
    )

    # Then it waited 375 + 375 + the 250 left, exactly the grace, and then sent KILL to the group
    assert clock.sleeps == [0.375, 0.375, 0.25]
    assert clock.now == 101.0
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=True
    )
    assert target.proc.wait() == -signal.SIGKILL


def test_a_zero_grace_kills_after_one_check_without_waiting(
    targets: Callable[..., Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = targets([sys.executable, "-c", _BLOCK_ALL], ready_line=True)
    clock = FakeClock()
    monkeypatch.setattr(controller_module, "time", clock)

    outcome = ProcessController().stop(target.handle.encode(), target.proc.pid, grace_ms=0, poll_ms=1000)

    assert clock.sleeps == []
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=True
    )
    assert target.proc.wait() == -signal.SIGKILL


def test_finish_stop_gives_the_stop_its_grace(
    targets: Callable[..., Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a leader that never reacts to TERM, and the controller on a fake clock
    target = targets([sys.executable, "-c", _BLOCK_ALL], ready_line=True)
    clock = FakeClock()
    monkeypatch.setattr(controller_module, "time", clock)

    # When a crashed stop is finished with a 1 s grace
    outcome = finish_stop(ProcessController(), target.handle.encode(), target.proc.pid, grace_ms=1000)

    # Then the leader got the whole stop with that grace (not the default), then KILL
    assert clock.now == pytest.approx(101.0)
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=True
    )
    assert target.proc.wait() == -signal.SIGKILL


def test_is_group_alive_counts_only_members_that_can_run(targets: Callable[..., Target]) -> None:
    # Given a live group leader
    target = targets(["/bin/sleep", "300"])
    pgid = target.handle.pgid
    assert is_group_alive(pgid) is True

    # When it exits but is not reaped, Then its zombie alone is no live member
    target.proc.kill()
    assert wait_for(lambda: (stat := read_stat(pgid)) is not None and stat.state == "Z")
    assert is_group_alive(pgid) is False

    # and a group number no process can have has none either
    assert is_group_alive(MAX_PID + 1) is False


def test_the_kernel_probe_of_a_group_leader_signals_nothing_and_is_remembered() -> None:
    """The probe sends signal 0 to the caller's own group: harmless only if it really is signal 0.

    Run in a forked child that leads its own group (as ``ql3 serve`` started from a shell does) and
    blocks every signal, so anything the probe delivered would stay pending.
    """
    # (in this process too, which does not lead its group: the probe then meets ESRCH, still "known")
    assert ProcessController()._group_flag_supported() is True
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.setpgid(0, 0)
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            controller = ProcessController()
            first = controller._group_flag_supported()
            second = controller._group_flag_supported()
            report = {"first": first, "second": second, "pending": sorted(signal.sigpending())}
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            raw = pipe.read()
    finally:
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # This kernel (6.9+) has the flag: the probe says so, once, and delivered nothing
    assert json.loads(raw) == {"first": True, "second": True, "pending": []}


@pytest.fixture
def pre_69_kernel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``pidfd_send_signal`` as a kernel without PIDFD_SIGNAL_PROCESS_GROUP answers: EINVAL for the flag."""
    real = signal.pidfd_send_signal
    flagged: list[int] = []

    def old_kernel(pidfd: int, sig: int, siginfo: None = None, flags: int = 0) -> None:
        if flags:
            flagged.append(flags)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real(pidfd, sig, siginfo, flags)

    monkeypatch.setattr(signal, "pidfd_send_signal", old_kernel)
    return flagged


def test_on_a_kernel_without_the_group_flag_stop_falls_back_after_one_probe(
    targets: Callable[..., Target], pre_69_kernel: list[int]
) -> None:
    # Given a kernel that refuses the group flag, and one controller that detects support itself
    controller = ProcessController()
    first, second = targets(["/bin/sleep", "300"]), targets(["/bin/sleep", "300"])

    # When it stops two groups
    outcomes = [
        controller.stop(t.handle.encode(), t.proc.pid, grace_ms=60_000, poll_ms=20) for t in (first, second)
    ]

    # Then both ended on TERM through the killpg fallback, and the flag was tried once (the probe)
    ended = StopOutcome(status="termination_requested", term_signal_sent=True, kill_signal_sent=False)
    assert outcomes == [ended, ended]
    assert [first.proc.wait(), second.proc.wait()] == [-signal.SIGTERM, -signal.SIGTERM]
    assert pre_69_kernel == [PIDFD_SIGNAL_PROCESS_GROUP]


def test_a_probe_error_other_than_einval_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pidfd: int, sig: int, siginfo: None = None, flags: int = 0) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(signal, "pidfd_send_signal", refused)

    with pytest.raises(PermissionError):
        ProcessController()._group_flag_supported()


@pytest.mark.parametrize("group_signal_via_pidfd", [True, False])
def test_a_forced_mode_is_used_as_given_without_probing(
    targets: Callable[..., Target], group_signal_via_pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a controller told which way to signal groups, and every pidfd signal recorded
    real = signal.pidfd_send_signal
    flags_used: list[int] = []

    def recording(pidfd: int, sig: int, siginfo: None = None, flags: int = 0) -> None:
        flags_used.append(flags)
        real(pidfd, sig, siginfo, flags)

    monkeypatch.setattr(signal, "pidfd_send_signal", recording)
    target = targets(["/bin/sleep", "300"])

    # When it stops a group
    outcome = ProcessController(group_signal_via_pidfd=group_signal_via_pidfd).stop(
        target.handle.encode(), target.proc.pid, grace_ms=60_000, poll_ms=20
    )

    # Then every signal went the forced way (the killpg fallback never passes the group flag)
    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=False
    )
    expected = PIDFD_SIGNAL_PROCESS_GROUP if group_signal_via_pidfd else 0
    assert flags_used and set(flags_used) == {expected}
