"""The shim publishes one receipt with the command's real exit code, and none if it is killed itself."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ql3.execution.receipts import RESERVED_RECEIPT_BYTES, receipt_path
from ql3.ports.execution import LaunchFailed
from tests.support.processes import ExecHarness, group_comms
from tests.support.waits import wait_for


@pytest.mark.parametrize(
    ("command", "exit_code"),
    [
        ("exit 0", 0),
        ("exit 7", 7),
        ("exit 255", 255),
        ("kill -TERM $$", 128 + signal.SIGTERM),
        ("kill -KILL $$", 128 + signal.SIGKILL),
        ("syntax error (", 2),
    ],
)
def test_the_receipt_holds_the_commands_exit_code(ex: ExecHarness, command: str, exit_code: int) -> None:
    ex.shell("att-code", command)
    ex.wait_exit("att-code")

    receipt = ex.receipt("att-code")
    assert receipt is not None
    assert receipt.exit_code == exit_code


def test_the_receipt_has_the_exact_shape_and_nothing_else_is_left(ex: ExecHarness) -> None:
    # Given a command started at a known time
    ex.shell("att-shape", "exit 3", callback_sequence=1, started_at_ms=1_700_000_000_000)

    # When it has finished
    ex.wait_exit("att-shape")

    # Then exactly one receipt file exists (beside the shim's launch identity), with the keys in order
    # and sane times
    assert sorted(os.listdir(ex.receipts)) == ["att-shape.json", "att-shape.launch"]
    path = receipt_path(ex.receipts, "att-shape")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # written into the reservation in place: the file keeps its reserved size, the rest NUL padding
    raw = path.read_bytes()
    assert len(raw) == RESERVED_RECEIPT_BYTES
    text = raw.rstrip(b"\0").decode()
    assert raw[len(text) :] == bytes(RESERVED_RECEIPT_BYTES - len(text))
    assert text.endswith("}\n") and text.count("\n") == 1  # complete: its newline last, and only there
    body = json.loads(text)
    assert list(body) == [
        "schemaVersion",
        "runId",
        "attemptId",
        "callbackSequence",
        "token",
        "startedAtMs",
        "finishedAtMs",
        "exitCode",
    ]
    assert body["schemaVersion"] == 1 and body["runId"] == ex.run_id and body["attemptId"] == "att-shape"
    assert body["token"] == ex.token and body["callbackSequence"] == 1 and body["exitCode"] == 3
    assert body["startedAtMs"] == 1_700_000_000_000 <= body["finishedAtMs"]


def test_a_published_receipt_is_never_overwritten(ex: ExecHarness) -> None:
    # Given a receipt already published for the attempt id
    ex.receipts.mkdir(parents=True, exist_ok=True)
    receipt_path(ex.receipts, "att-once").write_text("first\n")

    # When an attempt with the same id is launched, its receipt cannot be reserved: nothing starts
    with pytest.raises(LaunchFailed) as caught:
        ex.shell("att-once", "exit 9")
    assert caught.value.reason == "receipt_exists"

    # Then the first receipt stands and nothing else is left behind
    assert receipt_path(ex.receipts, "att-once").read_text() == "first\n"
    assert sorted(os.listdir(ex.receipts)) == ["att-once.json"]


def test_a_killed_shim_leaves_no_receipt(ex: ExecHarness) -> None:
    # Given a running attempt
    launched = ex.shell("att-killed", "sleep 300")
    assert wait_for(lambda: "sleep" in group_comms(launched.pid))

    # When the shim itself is SIGKILLed (it is our unreaped child, so the pid is still its own)
    os.kill(launched.pid, signal.SIGKILL)
    ex.wait_exit("att-killed")

    # Then there is simply no receipt: its reservation is untouched, beside the identity the shim
    # wrote before the command
    assert ex.receipt("att-killed") is None
    assert sorted(os.listdir(ex.receipts)) == ["att-killed.json", "att-killed.launch"]
    assert receipt_path(ex.receipts, "att-killed").read_bytes() == bytes(RESERVED_RECEIPT_BYTES)


def test_a_failed_publication_leaves_no_receipt_and_keeps_the_exit_code(ex: ExecHarness) -> None:
    # Given a command that removes the receipts directory, so that the receipt cannot be created
    # When it runs to completion
    launched = ex.shell("att-nopub", f"rm -rf '{ex.receipts}'; echo ran; exit 4", watch=False)
    _, status = os.waitpid(launched.pid, 0)

    # Then the shim still exits with the command's code, and no receipt appears
    assert os.waitstatus_to_exitcode(status) == 4
    assert ex.receipt("att-nopub") is None
    assert ex.log_path("att-nopub").read_text() == "ran\n"
