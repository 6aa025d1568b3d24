"""Task names in any script and durations as people write them (docs/tasks.md "Names", "Durations")."""

from __future__ import annotations

import argparse

import pytest

from ql3.cli.common import duration_s
from ql3.domain.durations import parse_duration_ms
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import TASK_NAME_RULE, validate_task_name


@pytest.mark.parametrize(
    "name",
    ["早报", "京东 签到", "jd_sign.py", "Überweisung", "emoji 🎉", "...", "a-b", "中" * 128, "x" * 128],
)
def test_printable_names_in_any_script_are_accepted(name: str) -> None:
    assert validate_task_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "/abs",
        "-flag",
        " lead",
        "trail ",
        ".",
        "..",
        "bell\x07",
        "line\nbreak",
        "sep\u2028",
        "x" * 129,
        7,
    ],
)
def test_names_breaking_the_rule_are_refused_with_the_rule(name: object) -> None:
    with pytest.raises(ValidationFailed) as refused:
        validate_task_name(name)

    assert str(refused.value) == f"invalid name: {TASK_NAME_RULE}"
    assert refused.value.details["field"] == "name"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90", 90_000),
        ("2.5", 2_500),
        ("0", 0),
        ("90s", 90_000),
        ("5m", 300_000),
        ("10m", 600_000),
        ("1h30m", 5_400_000),
        ("1h 5m", 3_900_000),  # as `task show` prints it
        ("1.5h", 5_400_000),
        ("2d", 172_800_000),
        ("1w2d", 777_600_000),
        ("500ms", 500),
        ("1m30s250ms", 90_250),
    ],
)
def test_durations_in_seconds_or_units(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "m", "5x", "30m1h", "1h1h", "10m5", "-5", "1e3", "5 m 3", "1 5", "nan"])
def test_bad_durations_are_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        parse_duration_ms(text)

    assert "90s, 5m, 1h30m" in str(refused.value)


def test_the_cli_type_gives_seconds_and_a_usage_error() -> None:
    assert duration_s("1h30m") == 5400.0
    with pytest.raises(argparse.ArgumentTypeError, match="1h30m"):
        duration_s("soon")


def test_secret_values_are_masked_longest_first_and_short_ones_are_left() -> None:
    from ql3.domain.variables import mask, mask_bytes

    secrets = ["pt_key=abc;", "abc", "on"]

    assert mask("cookie pt_key=abc; then abc, on", secrets) == "cookie *** then ***, on"
    assert mask_bytes("令牌 pt_key=abc;".encode(), secrets) == "令牌 ***".encode()
