"""Stop sends TERM to the whole group, and KILL after the grace when a member ignores TERM."""

from __future__ import annotations

import signal

from ql3.execution.controller import ProcessController
from tests.support.processes import ExecHarness, group_comms, live_group_members, signal_ignored
from tests.support.waits import wait_for


def test_a_group_member_that_ignores_term_is_killed_after_the_grace(ex: ExecHarness) -> None:
    # Given a command whose children include one that ignores TERM
    launched = ex.shell("att-stubborn", "(trap '' TERM; exec sleep 300) & sleep 300 & wait")
    pgid = launched.handle.pgid

    def stubborn_child_ready() -> bool:
        members = live_group_members(pgid)
        return group_comms(pgid).count("sleep") == 2 and any(
            signal_ignored(p, signal.SIGTERM) for p in members
        )

    assert wait_for(stubborn_child_ready)

    # When the attempt is stopped with a short grace
    outcome = ProcessController().stop(launched.handle.encode(), launched.pid, grace_ms=300, poll_ms=20)

    # Then TERM and then KILL went to the group, and nothing of it survives
    assert outcome.status == "termination_requested"
    assert outcome.term_signal_sent is True
    assert outcome.kill_signal_sent is True
    assert wait_for(lambda: live_group_members(pgid) == [])


def test_a_cooperative_group_ends_on_term_without_kill(ex: ExecHarness) -> None:
    # Given a running command with default signal dispositions
    launched = ex.shell("att-coop", "sleep 300")
    # (running the command itself: a TERM in the instant between the shim's fork and the exec is
    # absorbed by the shim's inherited handler, and only the KILL after the grace would end it)
    assert wait_for(lambda: "sleep" in group_comms(launched.handle.pgid))

    # When it is stopped with a long grace
    outcome = ProcessController().stop(launched.handle.encode(), launched.pid, grace_ms=60_000, poll_ms=20)

    # Then TERM alone ended it, and the shim recorded the signal exit in its receipt
    assert (outcome.status, outcome.term_signal_sent, outcome.kill_signal_sent) == (
        "termination_requested",
        True,
        False,
    )
    ex.wait_exit("att-coop")
    receipt = ex.receipt("att-coop")
    assert receipt is not None
    assert receipt.exit_code == 128 + signal.SIGTERM


def test_the_killpg_fallback_for_kernels_without_pidfd_group_signals(ex: ExecHarness) -> None:
    # Given a running command and a controller forced onto the pre-6.9 fallback
    launched = ex.shell("att-fallback", "sleep 300")
    assert wait_for(lambda: "sleep" in group_comms(launched.handle.pgid))
    controller = ProcessController(group_signal_via_pidfd=False)

    # When it is stopped
    outcome = controller.stop(launched.handle.encode(), None, grace_ms=60_000, poll_ms=20)

    # Then the group got TERM through killpg and ended
    assert (outcome.status, outcome.term_signal_sent, outcome.kill_signal_sent) == (
        "termination_requested",
        True,
        False,
    )
    assert wait_for(lambda: live_group_members(launched.handle.pgid) == [])
