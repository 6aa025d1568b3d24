"""The shim records its own identity before the command starts, so a caller that dies between the
spawn and journaling the handle can find the process after a restart (issue 9 item 2)."""

from __future__ import annotations

from ql3.execution.identity import probe
from ql3.execution.receipts import (
    delete_receipt,
    launch_identity_path,
    read_launch_identity,
)
from tests.support.processes import ExecHarness, group_comms
from tests.support.waits import wait_for


def test_the_launch_identity_is_the_handle_the_launcher_captured(ex: ExecHarness) -> None:
    # Given a running attempt
    launched = ex.shell("att-ident", "sleep 300")

    # When its command runs
    assert wait_for(lambda: "sleep" in group_comms(launched.pid))

    # Then the shim's self-recorded identity is exactly the launcher's handle, and it proves the process
    found = read_launch_identity(ex.receipts, "att-ident")
    assert found == launched.handle
    assert probe(found) == "running"
    assert oct(launch_identity_path(ex.receipts, "att-ident").stat().st_mode & 0o777) == "0o600"


def test_the_identity_is_written_before_the_command_starts(ex: ExecHarness) -> None:
    # Given a command that reports whether the identity file already exists when it starts
    path = launch_identity_path(ex.receipts, "att-first")
    launched = ex.shell("att-first", f"test -s {path}")

    # When it has finished
    ex.wait_exit("att-first")

    # Then the command saw it, so no instant of the command's life lacks the evidence
    receipt = ex.receipt("att-first")
    assert receipt is not None and receipt.exit_code == 0
    assert read_launch_identity(ex.receipts, "att-first") == launched.handle


def test_a_malformed_or_missing_identity_is_no_evidence(ex: ExecHarness) -> None:
    ex.receipts.mkdir(parents=True, exist_ok=True)
    assert read_launch_identity(ex.receipts, "att-none") is None
    for text in ("", "boot 12\n", "boot 0 5\n", "boot 12 5", "b 12 5\nextra\n", "bo ot 12 5\n"):
        launch_identity_path(ex.receipts, "att-bad").write_text(text)
        assert read_launch_identity(ex.receipts, "att-bad") is None, text


def test_consuming_the_receipt_removes_the_identity(ex: ExecHarness) -> None:
    ex.shell("att-gone", "true")
    ex.wait_exit("att-gone")

    assert delete_receipt(ex.receipts, "att-gone") is True

    assert read_launch_identity(ex.receipts, "att-gone") is None
    assert not launch_identity_path(ex.receipts, "att-gone").exists()
