"""What survives a shim that is gone is killed by identity, and only that (issue 8 item 6, issue 9 item 5).

``kill_orphans`` (and ``finish_stop``, ``sweep_orphans`` on top of it) signals a process only on proof that
it descends from the attempt: same boot, group and session as the shim's pid, started no earlier than the
shim, and this attempt's id in its initial environment. Every case below uses real processes left behind
by a real shim that exited normally (its receipt published, so the exit watcher leaves its group alone).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.execution.controller import ProcessController, StopOutcome, finish_stop, kill_orphans
from ql3.execution.identity import InvalidHandle, capture, read_stat
from ql3.execution.launcher import Launched
from tests.support.processes import ExecHarness, group_comms, live_group_members
from tests.support.waits import wait_for

# A member of the attempt's session that leaves its group for a group of its own.
_OWN_GROUP = "import os, time; os.setpgid(0, 0); print('moved', flush=True); time.sleep(300)"


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test leaves alive on purpose; each gets SIGKILL at teardown (a reused pid never does)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)


def _ended_with(ex: ExecHarness, attempt_id: str, command: str, sleeps: int) -> Launched:
    """A shim that exits 0 after starting ``sleeps`` background sleeps that outlive it."""
    launched = ex.shell(attempt_id, command)
    ex.wait_exit(attempt_id)
    assert read_stat(launched.pid) is None  # the shim is reaped: nothing pins its group any more
    assert wait_for(lambda: group_comms(launched.handle.pgid).count("sleep") == sleeps)
    return launched


def _start_ticks(pid: int) -> str:
    stat = read_stat(pid)
    assert stat is not None
    return stat.start_ticks


def test_every_orphan_of_an_ended_attempt_is_killed_and_counted(ex: ExecHarness) -> None:
    # Given an attempt whose shim ended and left two sleeps in its group
    launched = _ended_with(ex, "att-orphans", "sleep 300 & sleep 300 & exit 0", sleeps=2)

    # When its orphans are swept
    killed = kill_orphans(launched.handle)

    # Then both got SIGKILL, and the count says so
    assert killed == 2
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])
    # and a second sweep finds nothing left
    assert kill_orphans(launched.handle) == 0


@pytest.mark.parametrize("name", ["a) b (c", "ends in space "], ids=["parentheses", "trailing-space"])
def test_an_orphan_whose_name_holds_parentheses_or_spaces_is_still_recognised(
    ex: ExecHarness, tmp_path: Path, name: str
) -> None:
    # Given an orphan whose command name contains ") " or ends in a space (the session id is the fourth
    # field after the *last* parenthesis)
    link = tmp_path / name
    link.symlink_to("/bin/sleep")
    launched = ex.shell("att-odd", f"'{link}' 300 & exit 0")
    ex.wait_exit("att-odd")
    assert wait_for(lambda: group_comms(launched.handle.pgid) == [name.strip()])

    # When its orphans are swept, Then it is found and killed
    assert kill_orphans(launched.handle) == 1
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])


def test_a_member_without_the_attempt_id_in_its_environment_is_left_alone(
    ex: ExecHarness, leftovers: list[int]
) -> None:
    # Given two orphans in the group, one started with an environment that lacks the attempt's id
    launched = _ended_with(ex, "att-env", "sleep 300 & env -u QL3_ATTEMPT_ID sleep 300 & exit 0", sleeps=2)
    pgid = launched.handle.pgid
    stranger = next(
        pid
        for pid in live_group_members(pgid)
        if b"QL3_ATTEMPT_ID=att-env" not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    )
    leftovers.append(stranger)

    # When the orphans are swept
    # Then only the one that carries the attempt's id is killed
    assert kill_orphans(launched.handle) == 1
    assert wait_for(lambda: live_group_members(pgid) == [stranger])


def test_the_attempt_id_must_match_exactly_not_as_a_prefix(ex: ExecHarness, leftovers: list[int]) -> None:
    # Given orphans of attempt "att-p10"
    launched = _ended_with(ex, "att-p10", "sleep 300 & exit 0", sleeps=1)
    (orphan,) = live_group_members(launched.handle.pgid)
    leftovers.append(orphan)

    # When a handle for attempt "att-p1" (same numbers) sweeps, Then nothing of attempt "att-p10" is hit
    assert kill_orphans(dataclasses.replace(launched.handle, attempt_id="att-p1")) == 0
    assert read_stat(orphan) is not None and live_group_members(launched.handle.pgid) == [orphan]


def test_a_member_that_moved_to_another_group_is_left_alone(ex: ExecHarness, leftovers: list[int]) -> None:
    # Given an orphan of the attempt's session that moved into a process group of its own
    launched = ex.shell(
        "att-moved", f"{sys.executable} -c \"{_OWN_GROUP}\" > '{ex.root}/moved' & sleep 300 & exit 0"
    )
    ex.wait_exit("att-moved")
    # (the shell opens the file in the background child, which may do so only after the shim exited)
    moved = ex.root / "moved"
    assert wait_for(lambda: moved.is_file() and moved.read_text() == "moved\n", what="the mover's line")
    assert wait_for(lambda: group_comms(launched.handle.pgid) == ["sleep"])
    mover = next(
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit()
        and (stat := read_stat(int(name))) is not None
        and stat.pgrp == int(name)
        and b"QL3_ATTEMPT_ID=att-moved" in _environ(int(name))
    )
    leftovers.append(mover)

    # When the orphans are swept, Then the sleep in the group is killed and the mover is not
    assert kill_orphans(launched.handle) == 1
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])
    stat = read_stat(mover)
    assert stat is not None and stat.state != "Z"


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def test_a_process_that_started_before_the_shim_is_never_its_descendant(
    ex: ExecHarness, leftovers: list[int]
) -> None:
    # Given an orphan, and a handle that claims its shim started one tick after that orphan
    launched = _ended_with(ex, "att-early", "sleep 300 & exit 0", sleeps=1)
    (orphan,) = live_group_members(launched.handle.pgid)
    leftovers.append(orphan)
    ticks = int(_start_ticks(orphan))
    later_shim = dataclasses.replace(launched.handle, start_ticks=str(ticks + 1))

    # When that handle sweeps, Then the orphan is left alone
    assert kill_orphans(later_shim) == 0
    assert live_group_members(launched.handle.pgid) == [orphan]

    # But a shim that started in the very same tick may have left it: it is killed
    assert kill_orphans(dataclasses.replace(launched.handle, start_ticks=str(ticks))) == 1
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])


def test_a_handle_of_another_boot_kills_nothing(ex: ExecHarness, leftovers: list[int]) -> None:
    launched = _ended_with(ex, "att-boot", "sleep 300 & exit 0", sleeps=1)
    (orphan,) = live_group_members(launched.handle.pgid)
    leftovers.append(orphan)

    other_boot = dataclasses.replace(launched.handle, boot_id="00000000-0000-0000-0000-000000000000")

    assert kill_orphans(other_boot) == 0
    assert live_group_members(launched.handle.pgid) == [orphan]


def test_sweep_orphans_takes_the_handle_text(ex: ExecHarness) -> None:
    launched = _ended_with(ex, "att-text", "sleep 300 & sleep 300 & exit 0", sleeps=2)

    assert ProcessController().sweep_orphans(launched.handle.encode()) == 2
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])
    with pytest.raises(InvalidHandle):
        ProcessController().sweep_orphans("pid:1234")


NOTHING_SENT = StopOutcome(status="already_exited", term_signal_sent=False, kill_signal_sent=False)


def test_finish_stop_of_a_running_leader_is_a_whole_stop(ex: ExecHarness) -> None:
    # Given an attempt whose shim still runs its command
    launched = ex.shell("att-live", "sleep 300")
    assert wait_for(lambda: "sleep" in group_comms(launched.handle.pgid))

    # When a crashed stop is finished, Then the leader's group gets the stop itself
    outcome = finish_stop(ProcessController(), launched.handle.encode(), launched.pid, grace_ms=60_000)

    assert outcome == StopOutcome(
        status="termination_requested", term_signal_sent=True, kill_signal_sent=False
    )
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])


def test_finish_stop_kills_the_single_survivor_of_a_gone_leader(ex: ExecHarness) -> None:
    # Given an attempt whose shim is gone and one orphan that survived it
    launched = _ended_with(ex, "att-one", "sleep 300 & exit 0", sleeps=1)

    # When the stop is finished
    outcome = finish_stop(ProcessController(), launched.handle.encode(), launched.pid, grace_ms=0)

    # Then the leader was already gone, and the survivor got the KILL
    assert outcome == StopOutcome(status="already_exited", term_signal_sent=False, kill_signal_sent=True)
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])


def test_finish_stop_with_nothing_left_sends_nothing(ex: ExecHarness) -> None:
    launched = ex.shell("att-gone", "exit 0")
    ex.wait_exit("att-gone")

    assert (
        finish_stop(ProcessController(), launched.handle.encode(), launched.pid, grace_ms=0) == NOTHING_SENT
    )


def test_finish_stop_passes_on_what_stop_refused(ex: ExecHarness, leftovers: list[int]) -> None:
    # Given an orphan whose attempt ended, and a stop refused before any proof (wrong pid, bad text)
    launched = _ended_with(ex, "att-refused", "sleep 300 & exit 0", sleeps=1)
    (orphan,) = live_group_members(launched.handle.pgid)
    leftovers.append(orphan)
    controller = ProcessController()

    # Then finish_stop returns that refusal and sweeps nothing
    refused = finish_stop(controller, launched.handle.encode(), launched.pid + 1, grace_ms=0)
    assert refused == StopOutcome(status="pid_mismatch", term_signal_sent=False, kill_signal_sent=False)
    invalid = finish_stop(controller, "pid:1234", None, grace_ms=0)
    assert invalid == StopOutcome(status="invalid", term_signal_sent=False, kill_signal_sent=False)
    assert live_group_members(launched.handle.pgid) == [orphan]


# An orphan that forks one more sleeper each time a line arrives on a FIFO, and reports its pid.
_FORKER = """\
import os, sys, time
with open(sys.argv[1], "rb", buffering=0) as commands, open(sys.argv[2], "w") as acks:
    acks.write("ready\\n")
    acks.flush()
    while commands.readline():
        child = os.fork()
        if child == 0:
            time.sleep(300)
            os._exit(0)
        acks.write(f"{child}\\n")
        acks.flush()
"""


def test_a_descendant_forked_during_the_sweep_is_caught_by_the_next_pass(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an orphan that forks on request, whose attempt ended
    script, fifo, acks = ex.root / "forker.py", ex.root / "commands", ex.root / "acks"
    script.write_text(_FORKER)
    os.mkfifo(fifo)
    launched = ex.shell("att-fork", f"'{sys.executable}' '{script}' '{fifo}' '{acks}' & exit 0")
    commands = os.open(fifo, os.O_RDWR)  # never blocks, unlike a write-only open of a FIFO
    try:
        ex.wait_exit("att-fork")
        assert wait_for(lambda: acks.exists() and acks.read_text() == "ready\n")

        # When it forks a new descendant right after the sweep's first pass listed /proc
        real_pidfd_open = os.pidfd_open
        forked: list[int] = []

        def pidfd_open_after_a_fork(pid: int, flags: int = 0) -> int:
            if not forked:
                os.write(commands, b"fork\n")
                assert wait_for(lambda: len(acks.read_text().split()) == 2)
                forked.append(int(acks.read_text().split()[1]))
            return real_pidfd_open(pid, flags)

        monkeypatch.setattr(os, "pidfd_open", pidfd_open_after_a_fork)
        killed = kill_orphans(launched.handle)
        monkeypatch.undo()

        # Then the first pass kills the forker, and the next pass the process it forked meanwhile
        assert len(forked) == 1
        assert killed == 2
        assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])
    finally:
        os.close(commands)


def test_an_orphan_still_alive_after_its_kill_is_neither_signalled_nor_counted_twice(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two orphans, and KILLs that take effect only after the sweep (as when the machine is so
    # loaded that a KILLed process is not scheduled to die before the sweep's next pass)
    launched = _ended_with(ex, "att-slow-death", "sleep 300 & sleep 300 & exit 0", sleeps=2)
    real_send = signal.pidfd_send_signal
    deferred: list[int] = []

    def deferred_kill(pidfd: int, sig: int, siginfo: None = None, flags: int = 0) -> None:
        if sig == signal.SIGKILL:
            deferred.append(os.dup(pidfd))
            return
        real_send(pidfd, sig, siginfo, flags)

    monkeypatch.setattr(signal, "pidfd_send_signal", deferred_kill)
    try:
        # When the orphans are swept (every pass sees both still alive)
        killed = kill_orphans(launched.handle)
        monkeypatch.undo()

        # Then each got exactly one KILL, and the count is the number of processes
        assert (killed, len(deferred)) == (2, 2)
    finally:
        for pidfd in deferred:
            real_send(pidfd, signal.SIGKILL)
            os.close(pidfd)
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])


def test_an_orphan_that_vanishes_before_its_pidfd_opens_does_not_end_the_pass(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two orphans, the first of which the kernel reports gone when the sweep pins it
    launched = _ended_with(ex, "att-vanish", "sleep 300 & sleep 300 & exit 0", sleeps=2)
    real_pidfd_open = os.pidfd_open
    refused: list[int] = []

    def pidfd_open_first_gone(pid: int, flags: int = 0) -> int:
        if not refused:
            refused.append(pid)
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
        return real_pidfd_open(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", pidfd_open_first_gone)
    killed = kill_orphans(launched.handle)
    monkeypatch.undo()

    # Then the pass goes on to the second one, and the next pass finds the first still there
    assert len(refused) == 1
    assert killed == 2
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])


ENVIRON_CAP = 256 * 1024  # what kill_orphans reads of /proc/<pid>/environ
_SPAWN_WITH_ENV = """\
import json, os, sys, time
env = json.loads(sys.stdin.read())
child = os.fork()
if child == 0:
    os.execve("/bin/sleep", ["sleep", "300"], env)
print(child, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize(("marker_end", "killed"), [(ENVIRON_CAP, 1), (ENVIRON_CAP + 5, 0)])
def test_the_environment_is_read_up_to_its_cap_only(marker_end: int, killed: int) -> None:
    # Given a leader (no attempt id of its own) and its child, whose environment ends with the attempt
    # id at a chosen offset: wholly inside the first 256 KiB, or reaching 5 bytes past them
    marker = "QL3_ATTEMPT_ID=att-cap"
    pads = {"PAD0": "x" * 100_000, "PAD1": "x" * 100_000}
    used = sum(len(k) + 1 + len(v) + 1 for k, v in pads.items()) + len("PAD2=") + 1
    pads["PAD2"] = "x" * (marker_end - len(marker) - used)
    env = {**pads, "QL3_ATTEMPT_ID": "att-cap"}
    leader = subprocess.Popen(
        [sys.executable, "-c", _SPAWN_WITH_ENV],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        assert leader.stdin is not None and leader.stdout is not None
        handle = capture(leader.pid, "att-cap")
        leader.stdin.write(json.dumps(env).encode())
        leader.stdin.close()
        child = int(leader.stdout.readline())
        assert wait_for(lambda: marker.encode() in _environ(child))
        assert Path(f"/proc/{child}/environ").read_bytes().index(marker.encode()) + len(marker) == marker_end

        # When the orphans are swept, Then the child is found only when its attempt id is within the cap
        assert kill_orphans(handle) == killed
        assert read_stat(leader.pid) is not None  # the leader carries no attempt id: never a target
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        if leader.stdout is not None:
            leader.stdout.close()
