"""A log never keeps more than its cap plus the truncation marker, and readers never see more."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql3.execution.logs import LogReader, LogUnavailable, enforce_log_cap, log_path_for, truncation_marker
from tests.support.processes import ExecHarness
from tests.support.waits import wait_for

CAP = 1000
# 200 lines of 50 bytes: 10,000 bytes of output, ten times the cap.
NOISY = (
    "i=0; while [ $i -lt 200 ]; do echo 0123456789012345678901234567890123456789012345678; i=$((i+1)); done"
)
EXPECTED = b"0123456789012345678901234567890123456789012345678\n" * 200


def test_a_command_printing_past_the_cap_leaves_cap_bytes_then_the_marker(ex: ExecHarness) -> None:
    ex.shell("att-noisy", NOISY, log_cap_bytes=CAP)
    ex.wait_exit("att-noisy")

    data = ex.log_path("att-noisy").read_bytes()
    marker = truncation_marker(CAP)
    assert data.endswith(marker)
    assert len(data) <= CAP + len(marker)
    assert data == EXPECTED[:CAP] + marker


def test_the_cap_is_enforced_while_the_command_still_runs(ex: ExecHarness) -> None:
    # Given a command that prints past its cap and then keeps running
    go = ex.root / "go"
    ex.shell("att-running", f"{NOISY}; while [ ! -e '{go}' ]; do sleep 0.01; done", log_cap_bytes=CAP)

    # Then the watcher's periodic check cuts the log before the command ends
    try:
        assert wait_for(
            lambda: ex.log_path("att-running").read_bytes() == EXPECTED[:CAP] + truncation_marker(CAP)
        )
        assert not ex.exited["att-running"].is_set()
    finally:
        go.touch()
    ex.wait_exit("att-running")


def test_output_under_the_cap_is_left_alone(ex: ExecHarness) -> None:
    ex.shell("att-quiet", "echo small", log_cap_bytes=CAP)
    ex.wait_exit("att-quiet")

    assert ex.log_path("att-quiet").read_bytes() == b"small\n"


def test_enforcement_is_idempotent_and_recuts_late_appends(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"a" * 50)
    marker = truncation_marker(10)

    assert enforce_log_cap(path, 10) is True
    assert enforce_log_cap(path, 10) is False
    with path.open("ab") as f:
        f.write(b"late")
    assert enforce_log_cap(path, 10) is True
    assert path.read_bytes() == b"a" * 10 + marker
    assert enforce_log_cap(tmp_path / "missing.log", 10) is False


def test_enforcement_never_follows_a_link_at_the_log_name(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"a" * 50)
    small = tmp_path / "small"
    small.write_bytes(b"a")
    for size_of_target, name in ((50, "big.log"), (1, "small.log")):
        link = tmp_path / name
        link.symlink_to(target if size_of_target == 50 else small)
        with pytest.raises(OSError):
            enforce_log_cap(link, 10)
    assert target.read_bytes() == b"a" * 50  # nothing cut through the link


def _read_all(reader: LogReader, path: Path, chunk: int, cap: int | None) -> tuple[bytes, list[int]]:
    offset, out = 0, b""
    offsets: list[int] = []
    while True:
        data, offset = reader.read(path, offset, chunk, cap_bytes=cap)
        if not data:
            return out, offsets
        out += data
        offsets.append(offset)


def test_the_reader_pages_by_offset_in_bounded_chunks(tmp_path: Path) -> None:
    path = log_path_for(tmp_path, "att-1")
    path.write_bytes(EXPECTED)

    data, offsets = _read_all(LogReader(), path, 4096, None)

    assert data == EXPECTED
    assert offsets == [4096, 8192, len(EXPECTED)]
    assert LogReader().read(path, len(EXPECTED) + 5) == (b"", len(EXPECTED) + 5)


@pytest.mark.parametrize("chunk", [1, 7, 999, 1000, 1001, 64 * 1024])
def test_the_capped_view_is_identical_before_and_after_the_cut(tmp_path: Path, chunk: int) -> None:
    # Given the same oversized log, once uncut and once cut
    uncut, cut = tmp_path / "uncut.log", tmp_path / "cut.log"
    uncut.write_bytes(EXPECTED)
    cut.write_bytes(EXPECTED)
    enforce_log_cap(cut, CAP)

    # When both are read through the capped view in chunks
    seen_uncut, _ = _read_all(LogReader(), uncut, chunk, CAP)
    seen_cut, _ = _read_all(LogReader(), cut, chunk, CAP)

    # Then readers see the cap then the marker, whether or not the file was cut yet
    assert seen_uncut == seen_cut == EXPECTED[:CAP] + truncation_marker(CAP)


def test_reader_errors_are_low_cardinality(tmp_path: Path) -> None:
    with pytest.raises(LogUnavailable) as caught:
        LogReader().read(tmp_path / "secret-name.log", 0)
    assert "secret-name" not in str(caught.value)
    with pytest.raises(ValueError):
        LogReader().read(tmp_path / "x.log", -1)
    with pytest.raises(ValueError):
        LogReader().read(tmp_path / "x.log", 0, 0)
    with pytest.raises(ValueError):
        log_path_for(tmp_path, "../x")
