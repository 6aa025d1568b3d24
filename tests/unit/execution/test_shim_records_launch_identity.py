"""The shim records its own identity before the command starts, so a caller that dies between the
spawn and journaling the handle can find the process after a restart (issue 9 item 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ql3.execution.launcher as launcher_module
from ql3.execution.identity import CaptureFailed, ProcessHandle, probe
from ql3.execution.receipts import (
    delete_receipt,
    launch_identity_path,
    read_launch_identity,
)
from ql3.ports.execution import LaunchFailed
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


def test_a_launcher_that_dies_before_sending_the_ticks_starts_nothing(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a launcher that closes the shim's ticks pipe without a line, as its death would
    monkeypatch.setattr(launcher_module, "_send_ticks", lambda fd, ticks: None)
    marker = tmp_path / "ran"

    # When a command is launched
    ex.shell("att-orphan", f"touch {marker}")
    ex.wait_exit("att-orphan")

    # Then the shim ended before the command: it never ran, and there is no identity and no receipt
    assert not marker.exists()
    assert read_launch_identity(ex.receipts, "att-orphan") is None
    assert ex.receipt("att-orphan") is None


def test_the_ticks_pipe_is_not_left_to_the_command(ex: ExecHarness) -> None:
    # Given a command that exits 0 only when its shell has no descriptor 3 (test(1) opens nothing)
    ex.shell("att-fds", 'test ! -e "/proc/$$/fd/3"')

    # When it has finished, then it had none: the shim closed the launcher's pipe before it
    ex.wait_exit("att-fds")
    receipt = ex.receipt("att-fds")
    assert receipt is not None and receipt.exit_code == 0


def test_the_shims_own_descriptors_are_not_left_to_the_command(ex: ExecHarness) -> None:
    # Given a command that exits 0 only when its shell has none of the shim's descriptors: 4 (the
    # identity file) and 5 (the log, kept while the shim's own stderr is /dev/null)
    ex.shell("att-fd4", 'test ! -e "/proc/$$/fd/4" && test ! -e "/proc/$$/fd/5"')

    # When it has finished, then it had none: the shim closed them before it
    ex.wait_exit("att-fd4")
    receipt = ex.receipt("att-fd4")
    assert receipt is not None and receipt.exit_code == 0


def test_without_the_ticks_the_identity_file_made_before_the_wait_stays_empty(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a launcher that never sends the line, as its death right after the spawn would
    monkeypatch.setattr(launcher_module, "_send_ticks", lambda fd, ticks: None)
    marker = tmp_path / "ran"

    # When the shim has given up
    ex.shell("att-empty", f"touch {marker}")
    ex.wait_exit("att-empty")

    # Then the file it created before waiting holds nothing (no evidence), and the command never ran
    assert launch_identity_path(ex.receipts, "att-empty").read_bytes() == b""
    assert read_launch_identity(ex.receipts, "att-empty") is None
    assert not marker.exists()


def test_a_launch_that_cannot_capture_its_shim_leaves_no_identity_file(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a capture that fails after the spawn (the shim has made its identity file by then, or soon)
    def failing_capture(*args: object, **kwargs: object) -> ProcessHandle:
        # Wait until the shim created the file, so the launcher's clean-up is what removes it.
        assert wait_for(lambda: launch_identity_path(ex.receipts, "att-nocap").exists())
        raise CaptureFailed()

    monkeypatch.setattr(launcher_module, "capture", failing_capture)
    marker = tmp_path / "ran"

    # When the launch is attempted, it fails and nothing ran
    with pytest.raises(LaunchFailed):
        ex.shell("att-nocap", f"touch {marker}")

    # Then the shim was ended and reaped, and its empty identity file is gone with it
    assert not launch_identity_path(ex.receipts, "att-nocap").exists()
    assert not marker.exists()


def test_a_ticks_line_that_is_not_a_number_starts_nothing(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a launcher whose line is not start ticks
    monkeypatch.setattr(launcher_module, "_send_ticks", lambda fd, ticks: os.write(fd, b"12x\n"))
    marker = tmp_path / "ran"

    # When a command is launched
    ex.shell("att-garbled", f"touch {marker}")
    ex.wait_exit("att-garbled")

    # Then the shim ended before the command, with no evidence and no receipt
    assert not marker.exists()
    assert read_launch_identity(ex.receipts, "att-garbled") is None
    assert ex.receipt("att-garbled") is None


def test_an_existing_identity_path_is_never_followed_nor_overwritten(ex: ExecHarness, tmp_path: Path) -> None:
    # Given a link planted where the shim's identity file goes
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    ex.receipts.mkdir(parents=True, exist_ok=True)
    launch_identity_path(ex.receipts, "att-planted").symlink_to(target)

    # When the attempt runs
    ex.shell("att-planted", "true")
    ex.wait_exit("att-planted")

    # Then the link was not followed (noclobber creates with O_EXCL), and the command still ran
    assert target.read_text() == "keep\n"
    receipt = ex.receipt("att-planted")
    assert receipt is not None and receipt.exit_code == 0
