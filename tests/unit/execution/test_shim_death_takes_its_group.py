"""When the shim dies without its receipt, the rest of its process group dies with it (issue 9 item 5)."""

from __future__ import annotations

import os
import signal

from tests.support.processes import ExecHarness, group_comms, live_group_members
from tests.support.waits import wait_for

CHAIN = "sh -c 'sleep 300 & sleep 300; wait' & sleep 300 & wait"


def test_killing_only_the_shim_leaves_no_member_of_its_group_alive(ex: ExecHarness) -> None:
    # Given a running chain of shells and sleeps in the attempt's group
    launched = ex.shell("att-chain", CHAIN)
    pgid = launched.handle.pgid
    assert wait_for(lambda: group_comms(pgid).count("sleep") == 3)

    # When only the shim is SIGKILLed
    os.kill(launched.pid, signal.SIGKILL)
    ex.wait_exit("att-chain")

    # Then there is no receipt, and nothing of its group survives it
    assert ex.receipt("att-chain") is None
    assert wait_for(lambda: live_group_members(pgid) == [])


def test_a_shim_that_published_its_receipt_leaves_background_children_alone(ex: ExecHarness) -> None:
    # Given a command that leaves a background child behind and exits 0
    launched = ex.shell("att-bg", "sleep 300 & exit 0")
    pgid = launched.handle.pgid

    # When the shim has exited normally
    ex.wait_exit("att-bg")

    # Then its receipt is there and the child it left is not the shim's to kill
    receipt = ex.receipt("att-bg")
    assert receipt is not None and receipt.exit_code == 0
    # (the child may still be between its fork and its exec of sleep when the shim is gone)
    assert wait_for(lambda: group_comms(pgid) == ["sleep"])
