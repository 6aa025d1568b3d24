"""Stopping an attempt whose process already ended is "already_exited" and sends nothing."""

from __future__ import annotations

from ql3.execution.controller import ProcessController, StopOutcome
from ql3.execution.identity import read_stat
from tests.support.processes import ExecHarness
from tests.support.waits import wait_for

ALREADY_EXITED = StopOutcome(status="already_exited", term_signal_sent=False, kill_signal_sent=False)


def test_stop_after_the_shim_was_reaped(ex: ExecHarness) -> None:
    # Given an attempt that ran to completion and was reaped
    launched = ex.shell("att-done", "exit 0")
    ex.wait_exit("att-done")
    assert read_stat(launched.pid) is None

    # When it is stopped, Then nothing is signalled
    assert ProcessController().stop(launched.handle.encode(), launched.pid) == ALREADY_EXITED


def test_stop_of_an_unreaped_zombie_shim(ex: ExecHarness) -> None:
    # Given an attempt whose shim exited but was not reaped yet
    launched = ex.shell("att-zombie", "exit 0", watch=False)
    assert wait_for(lambda: (stat := read_stat(launched.pid)) is not None and stat.state == "Z")

    # When it is stopped, Then a zombie counts as exited and gets no signal
    assert ProcessController().stop(launched.handle.encode(), launched.pid) == ALREADY_EXITED
