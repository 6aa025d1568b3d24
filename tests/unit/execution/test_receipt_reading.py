"""read_receipt accepts exactly the published shape and names every other case with a fixed reason."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ql3.execution.receipts import (
    QUARANTINE_DIR,
    Receipt,
    ReceiptInvalid,
    delete_receipt,
    publish_receipt,
    quarantine_receipt,
    read_receipt,
    receipt_path,
    receipt_temp_path,
    token_digest,
)

TOKEN = "t" * 43
GOOD: dict[str, Any] = {
    "schemaVersion": 1,
    "runId": "run-1",
    "attemptId": "att-1",
    "callbackSequence": 2,
    "token": TOKEN,
    "startedAtMs": 1000,
    "finishedAtMs": 1500,
    "exitCode": 0,
}


def _read(directory: Path, attempt_id: str = "att-1") -> Receipt | None:
    return read_receipt(
        directory,
        attempt_id,
        expected_run_id="run-1",
        expected_sequence=2,
        expected_token_digest=token_digest(TOKEN),
    )


def _write_raw(directory: Path, raw: bytes, attempt_id: str = "att-1") -> None:
    """A complete file: what a writer leaves once it is done, its newline last."""
    receipt_path(directory, attempt_id).write_bytes(raw + b"\n")


def _with(**changes: Any) -> bytes:
    body = {k: v for k, v in {**GOOD, **changes}.items() if v is not ...}
    return json.dumps(body).encode()


def test_a_valid_receipt_is_returned_and_keeps_the_token_out_of_repr(tmp_path: Path) -> None:
    _write_raw(tmp_path, _with())

    receipt = _read(tmp_path)

    assert receipt == Receipt(
        run_id="run-1",
        attempt_id="att-1",
        callback_sequence=2,
        token=TOKEN,
        started_at_ms=1000,
        finished_at_ms=1500,
        exit_code=0,
    )
    assert TOKEN not in repr(receipt)


def test_no_receipt_is_none(tmp_path: Path) -> None:
    assert _read(tmp_path) is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b" " * 4090 + _with(), "too_large"),
        (b"\xff\xfe", "encoding"),
        (b'{"schemaVersion":1', "json"),
        (b"[1]", "shape"),
        (_with().replace(b'"exitCode": 0', b'"exitCode": 0, "exitCode": 0'), "duplicate_key"),
        (_with(extra=1), "unknown_key"),
        (_with(token=...), "missing_key"),
        (_with(schemaVersion=2), "schema_version"),
        (_with(schemaVersion=True), "schema_version"),
        (_with(startedAtMs=1000.0), "type"),
        (_with(finishedAtMs="1500"), "type"),
        (_with(exitCode=True), "type"),
        (_with(runId=1), "type"),
        (_with(callbackSequence=-1), "callback_sequence"),
        (_with(finishedAtMs=999), "time_order"),
        (_with(exitCode=256), "exit_code"),
        (_with(exitCode=-1), "exit_code"),
        (b'{"schemaVersion":1,"exitCode":NaN}', "json"),
        (_with(runId="run-2"), "run_id"),
        (_with(attemptId="att-2"), "attempt_id"),
        (_with(callbackSequence=3), "callback_sequence"),
        (_with(token="u" * 43), "token"),
    ],
)
def test_every_deviation_is_invalid_with_a_fixed_reason(tmp_path: Path, raw: bytes, reason: str) -> None:
    _write_raw(tmp_path, raw)

    with pytest.raises(ReceiptInvalid) as caught:
        _read(tmp_path)

    assert caught.value.reason == reason
    assert TOKEN not in str(caught.value) and "run-1" not in str(caught.value)


def test_a_symlink_or_directory_in_place_of_the_receipt_is_invalid(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_bytes(_with())
    receipt_path(tmp_path, "att-1").symlink_to(tmp_path / "elsewhere.json")
    receipt_path(tmp_path, "att-2").mkdir()

    for attempt_id in ("att-1", "att-2"):
        with pytest.raises(ReceiptInvalid) as caught:
            _read(tmp_path, attempt_id)
        assert caught.value.reason == "not_regular_file"


def test_the_expected_digest_must_be_a_sha256_hex(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        read_receipt(tmp_path, "att-1", expected_run_id="r", expected_sequence=0, expected_token_digest=TOKEN)


def test_quarantine_moves_invalid_receipts_without_overwriting(tmp_path: Path) -> None:
    # Given two invalid receipts published for the same attempt over time
    _write_raw(tmp_path, b"first")
    first = quarantine_receipt(tmp_path, "att-1")
    _write_raw(tmp_path, b"second")

    # When both are quarantined
    second = quarantine_receipt(tmp_path, "att-1")

    # Then both survive side by side in a private directory, and nothing is left in place
    qdir = tmp_path / QUARANTINE_DIR
    assert first is not None and second is not None and first != second
    assert (first.read_bytes(), second.read_bytes()) == (b"first\n", b"second\n")
    assert stat.S_IMODE(qdir.stat().st_mode) == 0o700
    assert not receipt_path(tmp_path, "att-1").exists()
    assert quarantine_receipt(tmp_path, "att-1") is None


def test_publish_then_delete(tmp_path: Path) -> None:
    receipt = Receipt(
        run_id="run-1",
        attempt_id="att-1",
        callback_sequence=2,
        token=TOKEN,
        started_at_ms=1000,
        finished_at_ms=1500,
        exit_code=0,
    )

    assert publish_receipt(tmp_path, receipt) is True
    assert publish_receipt(tmp_path, receipt) is False
    assert _read(tmp_path) == receipt
    assert os.listdir(tmp_path) == ["att-1.json"]
    assert delete_receipt(tmp_path, "att-1") is True
    assert delete_receipt(tmp_path, "att-1") is False
    assert os.listdir(tmp_path) == []


def _good_receipt() -> Receipt:
    return Receipt(
        run_id="run-1",
        attempt_id="att-1",
        callback_sequence=2,
        token=TOKEN,
        started_at_ms=1000,
        finished_at_ms=1500,
        exit_code=42,
    )


def test_a_receipt_cut_anywhere_before_its_final_newline_is_no_receipt_and_stays_in_place(
    tmp_path: Path,
) -> None:
    # Given every prefix of a published receipt, as a writer in progress (or killed) leaves it
    whole = (_good_receipt().to_json() + "\n").encode()
    path = receipt_path(tmp_path, "att-1")
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])

        # Then none of them reads as a receipt, valid or invalid, and the file is left for its writer
        assert _read(tmp_path) is None, whole[:cut]
        assert path.read_bytes() == whole[:cut]

    # And the whole one is the receipt
    path.write_bytes(whole)
    assert _read(tmp_path) == _good_receipt()


def test_a_write_cut_short_by_a_full_disk_is_no_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a disk that takes only the first 40 bytes of the receipt (no reservation: the file grows)
    real_pwrite = os.pwrite
    writes: list[int] = []

    def short_write(fd: int, data: Any, offset: int) -> int:
        if writes:
            raise OSError(28, "No space left on device")
        writes.append(fd)
        return real_pwrite(fd, bytes(data[:40]), offset)

    monkeypatch.setattr(os, "pwrite", short_write)

    # When the receipt is published
    with pytest.raises(OSError):
        publish_receipt(tmp_path, _good_receipt())
    monkeypatch.undo()

    # Then what was written is no receipt, and never one to quarantine
    assert receipt_path(tmp_path, "att-1").stat().st_size == 40
    assert _read(tmp_path) is None
    assert receipt_path(tmp_path, "att-1").exists()


def test_the_earlier_protocols_temp_file_is_removed_only_when_asked(tmp_path: Path) -> None:
    # Given a published receipt beside a temp file that only a shim of an earlier version leaves
    assert publish_receipt(tmp_path, _good_receipt()) is True
    temp = receipt_temp_path(tmp_path, "att-1")
    temp.write_bytes(b"partial")

    # When a worker deletes a receipt of a shim it launched itself, the temp file is not looked for
    assert delete_receipt(tmp_path, "att-1", legacy_temp=False) is True
    assert os.listdir(tmp_path) == [temp.name]

    # And by default (a re-adopted attempt) it is removed
    assert publish_receipt(tmp_path, _good_receipt()) is True
    assert delete_receipt(tmp_path, "att-1") is True
    assert os.listdir(tmp_path) == []
