"""The identity checks' exact answers: classify verdicts, capture's boot id, /proc stat parsing bounds."""

from __future__ import annotations

import base64
import json
import os

import pytest

from ql3.execution.identity import (
    MAX_PID,
    ProcessHandle,
    ProcStat,
    ProcStatUnreadable,
    capture,
    classify,
    parse_stat,
    read_stat,
)

BOOT = "boot-a"
HANDLE = ProcessHandle(attempt_id="att-1", boot_id=BOOT, pid=4321, pgid=4321, start_ticks="1000")


def _stat(**changes: object) -> ProcStat:
    fields: dict[str, object] = {"pid": 4321, "comm": "sh", "state": "S", "pgrp": 4321, "start_ticks": "1000"}
    fields.update(changes)
    return ProcStat(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stat", "boot", "verdict"),
    [
        (_stat(), BOOT, "match"),
        (_stat(), "boot-b", "exited"),  # another boot: every process of the old one is gone
        (None, BOOT, "exited"),  # no such pid
        (_stat(state="Z"), BOOT, "exited"),
        (_stat(start_ticks="1001"), BOOT, "exited"),  # pid reused by a later process
        (_stat(start_ticks="999"), BOOT, "mismatch"),  # started before ours: not ours, no proof of exit
        (_stat(pgrp=1), BOOT, "mismatch"),  # our process, moved to another group
    ],
    ids=["match", "other-boot", "no-pid", "zombie", "later-start", "earlier-start", "other-group"],
)
def test_classify_answers_exactly(stat: ProcStat | None, boot: str, verdict: str) -> None:
    assert classify(HANDLE, stat, boot) == verdict


def test_capture_uses_the_boot_id_it_is_given() -> None:
    handle = capture(os.getpid(), "att-1", boot_id="given-boot")

    assert (handle.boot_id, handle.pid, handle.pgid) == ("given-boot", os.getpid(), os.getpgid(0))


def _record(pid: str = "7", comm: str = "sh", *, n_fields: int = 20, **at: str) -> bytes:
    fields = [str(100 + i) for i in range(n_fields)]
    fields[0] = "S"
    for index, value in at.items():
        fields[int(index.removeprefix("f"))] = value
    return f"{pid} ({comm}) {' '.join(fields)}".encode()


def test_a_stat_record_of_exactly_twenty_fields_from_a_one_digit_pid_parses() -> None:
    stat = parse_stat(7, _record(comm="a) (b", f2="55", f19="987654"))

    assert (stat.pid, stat.comm, stat.state, stat.pgrp, stat.start_ticks) == (7, "a) (b", "S", 55, "987654")


@pytest.mark.parametrize(
    "record",
    [
        _record(n_fields=19),
        _record(f2="x"),  # a process group that is not a number
        _record(f19="1.5"),  # start ticks that are not a number
        _record(pid="8"),  # another pid's record
        b"7 sh S 1 2",  # no parentheses around comm
    ],
    ids=["19-fields", "bad-pgrp", "bad-start", "other-pid", "no-comm"],
)
def test_a_malformed_stat_record_is_refused(record: bytes) -> None:
    with pytest.raises(ProcStatUnreadable):
        parse_stat(7, record)


def test_the_handle_format_is_compact_utf8_json() -> None:
    handle = ProcessHandle(attempt_id="tâche-1", boot_id=BOOT, pid=5, pgid=5, start_ticks="9")

    body = handle.encode().removeprefix("ql3lp1.")
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))

    assert raw == '{"v":1,"h":"tâche-1","b":"boot-a","p":5,"g":5,"s":"9"}'.encode()
    assert json.loads(raw)["h"] == "tâche-1" and ProcessHandle.decode(handle.encode()) == handle


def test_a_comm_that_is_not_utf8_still_parses() -> None:
    # A process may be named by any bytes (the kernel copies the executable's file name)
    stat = parse_stat(7, b"7 (a\xffb) " + b" ".join([b"S", b"1", b"55"] + [b"0"] * 16 + [b"424242"]))

    assert (stat.comm, stat.pgrp, stat.start_ticks) == ("a\udcffb", 55, "424242")


@pytest.mark.parametrize("pid", [0, -1, MAX_PID + 1, True, 7.0])
def test_read_stat_refuses_a_pid_out_of_range(pid: object) -> None:
    with pytest.raises(ValueError, match=r"^pid out of range$"):
        read_stat(pid)  # type: ignore[arg-type]


def test_read_stat_accepts_the_whole_pid_range() -> None:
    # pid 1 always exists; MAX_PID is in range but above any pid_max Linux allows
    init = read_stat(1)
    assert init is not None and init.pid == 1
    assert read_stat(MAX_PID) is None


@pytest.mark.parametrize(
    "head",
    ["\u0667", "7a", "x"],  # an Arabic-Indic seven (a digit, but not ASCII), trailing junk, no digits
    ids=["non-ascii-digit", "digit-then-letter", "letter"],
)
def test_a_stat_record_whose_pid_is_not_ascii_digits_is_refused(head: str) -> None:
    with pytest.raises(ProcStatUnreadable):
        parse_stat(7, _record(pid=head))
