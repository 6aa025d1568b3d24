"""Capture reads a real process's identity from /proc; probe says running only for that exact process."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.execution.identity import (
    CaptureFailed,
    ProcStatUnreadable,
    capture,
    parse_stat,
    probe,
    read_boot_id,
    read_stat,
)
from tests.support.waits import wait_for

PAST_PID_MAX = 4_194_304 + 1  # above the largest pid_max Linux allows: never a live process


@pytest.fixture
def odd_name_sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose comm contains spaces and both kinds of parenthesis."""
    link = tmp_path / "a) b (c"
    link.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(link), "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_read_boot_id_is_the_trimmed_kernel_boot_id() -> None:
    expected = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    assert read_boot_id() == expected
    assert not read_boot_id().endswith("\n")


def test_read_stat_parses_comm_up_to_the_last_parenthesis(
    odd_name_sleeper: subprocess.Popen[bytes],
) -> None:
    stat = read_stat(odd_name_sleeper.pid)

    assert stat is not None
    assert stat.comm == "a) b (c"
    assert stat.pid == odd_name_sleeper.pid
    assert stat.pgrp == odd_name_sleeper.pid  # its own session, so its own group
    assert stat.state in ("R", "S", "D")  # D: a loaded machine may catch it in uninterruptible sleep
    raw = Path(f"/proc/{odd_name_sleeper.pid}/stat").read_text()
    assert stat.start_ticks == raw[raw.rindex(")") + 2 :].split()[19]


def test_read_stat_of_a_pid_that_cannot_exist_is_none() -> None:
    assert read_stat(PAST_PID_MAX) is None


def test_parse_stat_rejects_a_record_for_another_pid_or_a_short_record() -> None:
    record = b"42 (x) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0"

    assert parse_stat(42, record).start_ticks == "12345"
    with pytest.raises(ProcStatUnreadable):
        parse_stat(43, record)
    with pytest.raises(ProcStatUnreadable):
        parse_stat(42, b"42 (x) S 1 42")
    with pytest.raises(ProcStatUnreadable):
        parse_stat(42, b"42 x S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345")


def test_capture_then_probe_follows_the_process_through_its_exit(
    odd_name_sleeper: subprocess.Popen[bytes],
) -> None:
    # Given a captured live process
    handle = capture(odd_name_sleeper.pid, "attempt-1")
    assert (handle.pid, handle.pgid, handle.boot_id) == (
        odd_name_sleeper.pid,
        odd_name_sleeper.pid,
        read_boot_id(),
    )
    assert probe(handle) == "running"

    # When it is killed (a zombie until reaped, then gone)
    odd_name_sleeper.kill()
    assert wait_for(lambda: probe(handle) == "exited")
    odd_name_sleeper.wait()

    # Then it stays exited
    assert probe(handle) == "exited"


def test_probe_says_exited_for_any_identity_difference(odd_name_sleeper: subprocess.Popen[bytes]) -> None:
    handle = capture(odd_name_sleeper.pid, "attempt-1")
    later = str(int(handle.start_ticks) + 1)
    earlier = str(int(handle.start_ticks) - 1)

    assert probe(dataclasses.replace(handle, start_ticks=later)) == "exited"
    assert probe(dataclasses.replace(handle, start_ticks=earlier)) == "exited"
    assert probe(dataclasses.replace(handle, pgid=handle.pgid + 1)) == "exited"
    assert probe(dataclasses.replace(handle, boot_id="00000000-0000-0000-0000-000000000000")) == "exited"
    assert probe(dataclasses.replace(handle, pid=PAST_PID_MAX, pgid=PAST_PID_MAX)) == "exited"
    assert probe(handle) == "running"


def test_capture_of_a_missing_process_fails() -> None:
    with pytest.raises(CaptureFailed):
        capture(PAST_PID_MAX, "attempt-1")


def test_capture_refuses_a_zombie_unless_the_launcher_allows_it() -> None:
    # Given an exited but unreaped child
    proc = subprocess.Popen(["/bin/true"], start_new_session=True)
    try:
        assert wait_for(lambda: (stat := read_stat(proc.pid)) is not None and stat.state == "Z")

        # Then plain capture refuses it, while the launcher's variant still gets its identity
        with pytest.raises(CaptureFailed):
            capture(proc.pid, "attempt-1")
        assert capture(proc.pid, "attempt-1", allow_zombie=True).pgid == proc.pid
    finally:
        proc.wait()
