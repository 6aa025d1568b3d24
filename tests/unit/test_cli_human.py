"""Human output of the CLI: units, zones, short ids, colours, table widths, why a run waits."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ql3.cli import human, output, watch
from ql3.cli.main import main
from ql3.domain import cronexplain


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (850, "850ms"),
        (5000, "5s"),
        (12_500, "12.5s"),
        (600_000, "10m"),
        (3_905_000, "1h 5m"),
        (3_600_000, "1h"),
        (2 * 86_400_000 + 3 * 3_600_000 + 60_000, "2d 3h"),
        (None, None),
    ],
)
def test_durations_are_in_words_with_two_units_at_most(ms: int | None, text: str | None) -> None:
    assert human.duration(ms) == text


def test_times_are_local_and_labelled_unless_utc(zone: None) -> None:
    ms = 1_796_180_400_000  # 2026-12-02 03:00:00 UTC

    assert human.when(ms, utc=True) == "2026-12-02 03:00:00 UTC"
    assert human.when(ms, utc=False) == "2026-12-02 11:00:00 CST"
    assert human.when(ms, utc=False, label=False) == "2026-12-02 11:00:00"
    assert human.zone_label(False) == "CST" and human.zone_label(True) == "UTC"


def test_short_ids_grow_only_where_13_characters_do_not_tell_ids_apart() -> None:
    a = "01a230ad-0ea7-73d0-9e2f-633dc7e4100e"
    b = "01a230ad-0ea7-74d0-9e2f-633dc7e4100e"
    c = "01a230ae-146c-7000-8000-000000000000"

    assert human.short_ids([a, b, c]) == {a: a[:16], b: b[:16], c: c[:13]}


def test_colours_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert human.colour_enabled(Tty()) is True
    assert human.colour_enabled(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert human.colour_enabled(Tty()) is False


def test_a_table_on_a_terminal_colours_the_status_and_keeps_the_columns_aligned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    monkeypatch.setattr("sys.stdout", out)

    output.table(("ID", "STATUS", "EXIT"), [("a", "failed", 2), ("b", "succeeded", 0)], status_column=1)

    lines = out.getvalue().splitlines()
    assert lines[1] == "a   \x1b[31mfailed\x1b[0m     2"
    assert lines[2] == "b   \x1b[32msucceeded\x1b[0m  0"


def test_a_wide_table_is_cut_to_100_columns_in_its_elastic_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)

    output.table(("ID", "NAME", "STATUS"), [("x" * 13, "n" * 120, "queued")], elastic=(1,))

    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) == 100
    assert lines[1].endswith("…  queued")


class FakeApi:
    """Answers GET run with the next scripted run body."""

    def __init__(self, *runs: dict[str, Any]) -> None:
        self.runs = list(runs)

    def call(self, method: str, path: str, **_: Any) -> tuple[int, dict[str, Any]]:
        return 200, self.runs.pop(0)


def test_waiting_says_why_a_run_is_still_queued_each_time_the_reason_changes() -> None:
    run = {"id": "r", "status": "queued", "waiting_reason": "queued"}
    api = FakeApi(
        {**run, "waiting_reason": "no_free_slot"},
        {**run, "waiting_reason": "no_free_slot"},
        {**run, "waiting_reason": "no_matching_worker"},
        {**run, "status": "running", "waiting_reason": None},
    )
    said: list[str] = []

    left = watch.wait_while_queued(
        api,  # type: ignore[arg-type]
        "default",
        run,
        watch.Poller(sleep=lambda s: None),
        said.append,
    )

    assert left["status"] == "running"
    assert said == [
        "still queued: no free slot: every slot of the matching workers is busy",
        "still queued: no matching worker: no worker has the labels the task requires",
    ]


def test_waiting_without_a_reason_from_the_server_says_still_queued_once() -> None:
    ticks = iter([0.0, 1.0, 4.0, 5.0, 6.0, 7.0])
    run = {"id": "r", "status": "queued"}
    api = FakeApi(dict(run), dict(run), dict(run), {"id": "r", "status": "succeeded"})
    said: list[str] = []

    watch.wait_while_queued(
        api,  # type: ignore[arg-type]
        "default",
        run,
        watch.Poller(sleep=lambda s: None),
        said.append,
        clock=lambda: next(ticks),
    )

    assert said == ["still queued: waiting for a worker to take it"]


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("61 * * * *", "field 1 (minute) is wrong"),
        ("0 24 * * *", "field 2 (hour) is wrong"),
        ("0 0 32 * *", "field 3 (day-of-month) is wrong"),
        ("0 0 1 13 *", "field 4 (month) is wrong"),
        ("0 0 * * 8", "field 5 (day-of-week) is wrong"),
        ("0 0 31 2 *", "never match a date"),
        ("@hourly", "e.g. '0 * * * *' for @hourly"),
        ("0 3 * *", "this one has 4"),
    ],
)
def test_an_invalid_cron_names_the_field_and_why(expr: str, why: str) -> None:
    reason = cronexplain.explain(expr)
    assert reason is not None and why in reason


def test_a_valid_cron_has_no_explanation() -> None:
    assert cronexplain.explain("*/5 1-3 * jan,feb mon-fri") is None


def test_no_arguments_print_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "usage: ql3" in capsys.readouterr().out


def test_a_usage_error_under_json_is_a_json_error_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--json", "run", "list", "--limit", "0"])

    captured = capsys.readouterr()
    assert code == 64 and captured.out == ""
    error = json.loads(captured.err)["error"]
    assert error["code"] == "usage" and "--limit" in error["message"]


def test_a_local_usage_error_under_json_keeps_its_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QL3_HOME", str(tmp_path))
    code = main(["task", "add", "x", "--command", "true", "--env", "BROKEN", "--json"])

    captured = capsys.readouterr()
    assert code == 64
    assert json.loads(captured.err) == {"error": {"code": "usage", "message": "--env must be KEY=VALUE"}}


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_are_printed_for_each_shell(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "ql3" in script and "_ARGCOMPLETE" in script


def test_completion_answers_from_the_parser(tmp_path: Any) -> None:
    import subprocess
    import sys

    answer = tmp_path / "answer"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_SHELL": "bash",
        "COMP_LINE": "ql3 run ",
        "COMP_POINT": "8",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
        "_ARGCOMPLETE_IFS": "\n",
    }
    done = subprocess.run(
        [sys.executable, "-m", "ql3.cli.main"], env=env, capture_output=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    words = set(answer.read_text().split())
    assert {"start", "list", "show", "logs", "cancel"} <= words
