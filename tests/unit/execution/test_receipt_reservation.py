"""The receipt's space is reserved before the spawn (``reserve_receipt``) and filled in place: an empty
or torn reservation is no receipt (never valid, never quarantined), a complete one is read exactly."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from ql3.execution.receipts import (
    MAX_RECEIPT_BYTES,
    RESERVED_RECEIPT_BYTES,
    Receipt,
    ReceiptInvalid,
    publish_receipt,
    read_receipt,
    receipt_path,
    receipt_published,
    reserve_receipt,
    token_digest,
    unreserve_receipt,
)

TOKEN = "t" * 43
RECEIPT = Receipt(
    run_id="run-1",
    attempt_id="att-1",
    callback_sequence=1,
    token=TOKEN,
    started_at_ms=1000,
    finished_at_ms=1500,
    exit_code=7,
)
WHOLE = (RECEIPT.to_json() + "\n").encode()


def _read(directory: Path) -> Receipt | None:
    return read_receipt(
        directory,
        "att-1",
        expected_run_id="run-1",
        expected_sequence=1,
        expected_token_digest=token_digest(TOKEN),
    )


def _fill_in_place(path: Path, data: bytes) -> None:
    """What the shim's ``printf ... 1<>FILE`` does: write from offset 0, no truncation."""
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.pwrite(fd, data, 0) == len(data)
    finally:
        os.close(fd)


def test_a_reservation_is_a_page_of_nul_bytes_allocated_and_private(tmp_path: Path) -> None:
    reserve_receipt(tmp_path, "att-1")

    path = receipt_path(tmp_path, "att-1")
    st = path.stat()
    assert path.read_bytes() == bytes(RESERVED_RECEIPT_BYTES)
    assert RESERVED_RECEIPT_BYTES >= MAX_RECEIPT_BYTES
    assert st.st_blocks * 512 >= RESERVED_RECEIPT_BYTES  # allocated now, not when the shim writes
    assert st.st_mode & 0o777 == 0o600


def test_a_reservation_never_replaces_a_file_and_leaves_nothing_when_space_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a receipt already there: reserving again is refused and the receipt stands
    receipt_path(tmp_path, "att-1").write_bytes(WHOLE)
    with pytest.raises(FileExistsError):
        reserve_receipt(tmp_path, "att-1")
    assert receipt_path(tmp_path, "att-1").read_bytes() == WHOLE

    # And a full disk refuses the reservation with ENOSPC, leaving no file behind
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError) as caught:
        reserve_receipt(tmp_path, "att-2")
    assert caught.value.errno == errno.ENOSPC
    assert not receipt_path(tmp_path, "att-2").exists()


def test_without_fallocate_the_reservation_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    reserve_receipt(tmp_path, "att-1")

    assert receipt_path(tmp_path, "att-1").read_bytes() == bytes(RESERVED_RECEIPT_BYTES)


def test_an_empty_reservation_is_no_receipt_and_is_left_in_place(tmp_path: Path) -> None:
    reserve_receipt(tmp_path, "att-1")

    assert _read(tmp_path) is None
    assert not receipt_published(receipt_path(tmp_path, "att-1"))
    assert receipt_path(tmp_path, "att-1").read_bytes() == bytes(RESERVED_RECEIPT_BYTES)


def test_a_torn_write_into_the_reservation_is_no_receipt_at_any_length(tmp_path: Path) -> None:
    # Given every prefix of the receipt written into a fresh reservation (a shim killed mid-write)
    path = receipt_path(tmp_path, "att-1")
    for cut in range(len(WHOLE)):
        unreserve_receipt(tmp_path, "att-1")
        reserve_receipt(tmp_path, "att-1")
        _fill_in_place(path, WHOLE[:cut])

        # Then none reads as a receipt, valid or invalid, and the file stays for its writer
        assert _read(tmp_path) is None, WHOLE[:cut]
        assert not receipt_published(path)
        assert path.stat().st_size == RESERVED_RECEIPT_BYTES


def test_a_complete_receipt_in_the_reservation_is_read_and_the_file_never_grows(tmp_path: Path) -> None:
    reserve_receipt(tmp_path, "att-1")
    path = receipt_path(tmp_path, "att-1")

    _fill_in_place(path, WHOLE)

    assert _read(tmp_path) == RECEIPT
    assert receipt_published(path)
    assert path.stat().st_size == RESERVED_RECEIPT_BYTES
    assert path.read_bytes() == WHOLE + bytes(RESERVED_RECEIPT_BYTES - len(WHOLE))


def test_a_receipt_that_fills_the_whole_reservation_is_read(tmp_path: Path) -> None:
    # Given the largest receipt: exactly the reservation, no padding left
    big = Receipt(
        run_id="r" * (RESERVED_RECEIPT_BYTES - len(WHOLE) + len("run-1")),
        attempt_id="att-1",
        callback_sequence=1,
        token=TOKEN,
        started_at_ms=1000,
        finished_at_ms=1500,
        exit_code=7,
    )
    data = (big.to_json() + "\n").encode()
    assert len(data) == RESERVED_RECEIPT_BYTES
    reserve_receipt(tmp_path, "att-1")
    _fill_in_place(receipt_path(tmp_path, "att-1"), data)

    found = read_receipt(
        tmp_path,
        "att-1",
        expected_run_id=big.run_id,
        expected_sequence=1,
        expected_token_digest=token_digest(TOKEN),
    )
    assert found == big


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"schemaVersion":1}\n', "missing_key"),
        (WHOLE[:-2] + b"\0}\n", "json"),  # a NUL inside the text is never padding
    ],
)
def test_a_complete_but_wrong_receipt_in_a_reservation_is_invalid(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    reserve_receipt(tmp_path, "att-1")
    _fill_in_place(receipt_path(tmp_path, "att-1"), data)

    with pytest.raises(ReceiptInvalid) as caught:
        _read(tmp_path)
    assert caught.value.reason == reason


def test_publish_fills_a_reservation_in_place_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a reservation on a disk that would refuse any new block
    reserve_receipt(tmp_path, "att-1")
    opened: list[int] = []
    real_open = os.open

    def no_create(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(flags)
        assert not flags & (os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_create)

    # When the receipt is published twice
    assert publish_receipt(tmp_path, RECEIPT) is True
    assert publish_receipt(tmp_path, RECEIPT) is False
    monkeypatch.undo()

    # Then it was written into the reservation (never created, truncated nor appended), and reads back
    assert opened
    assert _read(tmp_path) == RECEIPT
    assert receipt_path(tmp_path, "att-1").stat().st_size == RESERVED_RECEIPT_BYTES
