"""Signals to the shim never cost the receipt, and the command starts with default dispositions."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ql3.ports.execution import ArgvCommand
from tests.support.processes import ExecHarness
from tests.support.waits import wait_for

DISPOSITION_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGPIPE)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_shim_alone_does_not_lose_the_commands_exit_code(
    ex: ExecHarness, tmp_path: Path, sig: signal.Signals
) -> None:
    # Given a command that waits for a go file and then exits 9
    started, go = tmp_path / "started", tmp_path / "go"
    launched = ex.shell("att-sig", f"touch '{started}'; while [ ! -e '{go}' ]; do sleep 0.01; done; exit 9")
    assert wait_for(started.exists)

    # When only the shim receives the signal (our unreaped child), and afterwards the command finishes
    os.kill(launched.pid, sig)
    go.touch()
    ex.wait_exit("att-sig")

    # Then the shim survived the signal and recorded the command's real status
    receipt = ex.receipt("att-sig")
    assert receipt is not None
    assert receipt.exit_code == 9


def test_the_command_starts_with_default_signal_dispositions(ex: ExecHarness) -> None:
    ex.launch("att-disp", ArgvCommand(file="grep", args=("-E", "^Sig(Ign|Blk):", "/proc/self/status")))
    ex.wait_exit("att-disp")

    masks = dict(line.split(":\t") for line in ex.log_path("att-disp").read_text().splitlines())
    for sig in DISPOSITION_SIGNALS:
        bit = 1 << (sig - 1)
        assert not int(masks["SigIgn"], 16) & bit, sig.name
        assert not int(masks["SigBlk"], 16) & bit, sig.name
