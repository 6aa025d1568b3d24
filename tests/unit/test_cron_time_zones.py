"""Cron in a time zone (docs/tasks.md "Time zones"): the CRON_TZ= prefix, daylight-saving gaps and
folds, six-field crons with their minimum interval, and UTC for an expression without a prefix."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from ql3.domain import cronexplain, timezones
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import next_fire_ms, validate_cron

BERLIN = ZoneInfo("Europe/Berlin")


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _fires(expr: str, after: datetime, n: int, zone: ZoneInfo = BERLIN) -> list[str]:
    out: list[str] = []
    at = _ms(after)
    for _ in range(n):
        at = next_fire_ms(expr, at)
        out.append(datetime.fromtimestamp(at / 1000, tz=zone).isoformat())
    return out


def test_a_shanghai_morning_cron_fires_at_midnight_utc() -> None:
    expr = validate_cron("CRON_TZ=Asia/Shanghai  0 8 * * *")

    fire = next_fire_ms(expr, _ms(datetime(2026, 12, 5, 1, 0, tzinfo=UTC)))

    assert expr == "CRON_TZ=Asia/Shanghai 0 8 * * *"
    assert datetime.fromtimestamp(fire / 1000, tz=UTC) == datetime(2026, 12, 6, 0, 0, tzinfo=UTC)


def test_an_expression_without_a_prefix_stays_in_utc() -> None:
    fire = next_fire_ms("0 8 * * *", _ms(datetime(2026, 12, 5, 1, 0, tzinfo=UTC)))

    assert datetime.fromtimestamp(fire / 1000, tz=UTC) == datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
    assert timezones.zone_of("0 8 * * *") == "UTC"
    assert timezones.zone_of("CRON_TZ=Asia/Shanghai 0 8 * * *") == "Asia/Shanghai"


def test_a_fixed_time_in_the_spring_gap_fires_once_right_after_the_jump() -> None:
    # 2026-03-29 in Berlin: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    fires = _fires("CRON_TZ=Europe/Berlin 30 2 * * *", datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN), 3)

    assert fires == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_an_interval_skips_the_hour_the_spring_gap_removes() -> None:
    fires = _fires("CRON_TZ=Europe/Berlin */30 * * * *", datetime(2026, 3, 29, 1, 0, tzinfo=BERLIN), 3)

    assert fires == ["2026-03-29T01:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"]


def test_a_fixed_time_in_the_autumn_fold_fires_once() -> None:
    # 2026-10-25 in Berlin: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice.
    fires = _fires("CRON_TZ=Europe/Berlin 30 2 * * *", datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN), 2)
    # and from inside the second pass, the next fire is the next day's
    second_pass = datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN, fold=1)

    assert fires == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    assert _fires("CRON_TZ=Europe/Berlin 30 2 * * *", second_pass, 1) == ["2026-10-26T02:30:00+01:00"]


def test_an_interval_fires_in_both_passes_of_the_autumn_fold() -> None:
    fires = _fires("CRON_TZ=Europe/Berlin 30 * * * *", datetime(2026, 10, 25, 1, 45, tzinfo=BERLIN), 3)

    assert fires == ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00", "2026-10-25T03:30:00+01:00"]


def test_six_fields_read_seconds_first() -> None:
    shanghai = ZoneInfo("Asia/Shanghai")
    fires = _fires("CRON_TZ=Asia/Shanghai 30 0 8 * * *", datetime(2026, 12, 5, 0, 0, tzinfo=UTC), 2, shanghai)

    assert fires == ["2026-12-05T08:00:30+08:00", "2026-12-06T08:00:30+08:00"]


@pytest.mark.parametrize(
    ("expr", "gap"), [("*/5 * * * * *", 5), ("*/7 * * * * *", 4), ("0,9 * * * * *", 9), ("* * * * * *", 1)]
)
def test_six_field_crons_faster_than_the_minimum_interval_are_refused(expr: str, gap: int) -> None:
    with pytest.raises(ValidationFailed) as refused:
        validate_cron(expr)

    assert f"fires {gap} s apart" in str(refused.value)
    assert f"every {cronexplain.MIN_SECONDS_INTERVAL} s" in str(refused.value)


@pytest.mark.parametrize("expr", ["*/10 * * * * *", "0,30 * * * * *", "15 */5 * * * *", "0 0 8 * * *"])
def test_six_field_crons_at_the_minimum_interval_or_slower_are_accepted(expr: str) -> None:
    assert validate_cron(expr) == expr


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("CRON_TZ=Mars/Olympus 0 8 * * *", "unknown time zone 'Mars/Olympus'"),
        ("CRON_TZ=../../etc/passwd 0 8 * * *", "is not a time zone name"),
        ("CRON_TZ=/etc/localtime 0 8 * * *", "is not a time zone name"),
        ("CRON_TZ= 0 8 * * *", "is not a time zone name"),
        ("CRON_TZ=Asia/Shanghai", "the cron expression is empty"),
        ("1 2 3 4 5 6 7", "this one has 7"),
    ],
)
def test_bad_zones_and_field_counts_are_refused_with_the_reason(expr: str, says: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        validate_cron(expr)

    assert says in str(refused.value)
    assert refused.value.details.get("field") == "cron"
