"""Why a cron expression is invalid, in words: which field, what it accepts, cronsim's reason.

Five fields (minute hour day month weekday) or six with seconds first (QingLong's format), optionally
behind a ``CRON_TZ=ZONE`` prefix (ql3.domain.timezones).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import pairwise
from typing import Final

from cronsim import CronSim, CronSimError

from ql3.domain import timezones

FIELDS: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
RANGES: Final = ("0-59", "0-23", "1-31", "1-12 or jan-dec", "0-7 or sun-sat (0 and 7 are Sunday)")
MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
SYNTAX: Final = "a number, *, a list a,b, a range a-b or a step */n"
# Six-field crons: two fires of one schedule are at least this far apart (docs/tasks.md "Seconds").
MIN_SECONDS_INTERVAL: Final = 10
_START: Final = datetime(2026, 1, 1, tzinfo=UTC)


def _parses(expr: str) -> str | None:
    """None when cronsim accepts ``expr``, else its reason."""
    try:
        CronSim(expr, _START)
    except (CronSimError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _seconds_gap(seconds_field: str) -> int:
    """The shortest gap, in seconds, between two fires of the seconds field on consecutive seconds
    of a minute that fires every minute (the worst case, so the bound holds whatever the others say)."""
    marks: list[int] = []
    it = CronSim(f"{seconds_field} * * * * *", _START - timedelta(seconds=1))
    for moment in it:
        if moment >= _START + timedelta(minutes=1):
            break
        marks.append(moment.second)
    if len(marks) < 2:
        return 60
    gaps = [b - a for a, b in pairwise(marks)]
    gaps.append(60 - marks[-1] + marks[0])
    return min(gaps)


@lru_cache(maxsize=1024)
def explain(expr: str) -> str | None:
    """None for a valid expression, else a sentence naming the wrong part and why. Remembered per
    expression (a pure function of the text): the cron loop validates every due task's spec, and a
    busy minute has a thousand tasks on a handful of expressions."""
    zone_name, text = timezones.split_cron(expr)
    if zone_name is not None:
        problem = timezones.zone_problem(zone_name)
        if problem is not None:
            return f"CRON_TZ: {problem}"
    text = " ".join(text.split())
    if not text:
        return "the cron expression is empty; it has five fields: " + " ".join(FIELDS)
    if text.startswith("@"):
        word = text.split(" ")[0].lower()
        instead = MACROS.get(word)
        written = f", e.g. '{instead}' for {word}" if instead else ""
        return "macros such as @daily are not accepted; write the five fields" + written
    parts = text.split(" ")
    if len(parts) not in (5, 6):
        return (
            f"a cron expression has 5 fields ({' '.join(FIELDS)}) or 6 with seconds first,"
            f" this one has {len(parts)}" + ("; years are not supported" if len(parts) == 7 else "")
        )
    names = ("second", *FIELDS) if len(parts) == 6 else FIELDS
    ranges = ("0-59", *RANGES) if len(parts) == 6 else RANGES
    for i, name in enumerate(names):
        alone = ["*"] * len(parts)
        alone[i] = parts[i]
        reason = _parses(" ".join(alone))
        if reason is not None:
            return f"field {i + 1} ({name}) is wrong: {reason}; it takes {SYNTAX} within {ranges[i]}"
    reason = _parses(text)
    if reason is not None:
        return f"the fields never match a date ({reason}): check the day-of-month against the month"
    if len(parts) == 6 and (gap := _seconds_gap(parts[0])) < MIN_SECONDS_INTERVAL:
        return (
            f"the seconds field fires {gap} s apart; six-field crons fire at most every"
            f" {MIN_SECONDS_INTERVAL} s (e.g. '*/{MIN_SECONDS_INTERVAL} * * * * *')"
        )
    return None
