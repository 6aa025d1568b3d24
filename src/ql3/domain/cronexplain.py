"""Why a cron expression is invalid, in words: which field, what it accepts, cronsim's reason."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from cronsim import CronSim, CronSimError

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
_START: Final = datetime(2026, 1, 1, tzinfo=UTC)


def _parses(expr: str) -> str | None:
    """None when cronsim accepts ``expr``, else its reason."""
    try:
        CronSim(expr, _START)
    except (CronSimError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    return None


def explain(expr: str) -> str | None:
    """None for a valid five-field expression, else a sentence naming the wrong field and why."""
    text = " ".join(expr.split())
    if not text:
        return "the cron expression is empty; it has five fields: " + " ".join(FIELDS)
    if text.startswith("@"):
        word = text.split(" ")[0].lower()
        instead = MACROS.get(word)
        written = f", e.g. '{instead}' for {word}" if instead else ""
        return "macros such as @daily are not accepted; write the five fields" + written
    parts = text.split(" ")
    if len(parts) != 5:
        return f"a cron expression has 5 fields ({' '.join(FIELDS)}), this one has {len(parts)}" + (
            "; seconds and years are not supported" if len(parts) in (6, 7) else ""
        )
    for i, name in enumerate(FIELDS):
        alone = ["*"] * 5
        alone[i] = parts[i]
        reason = _parses(" ".join(alone))
        if reason is not None:
            return f"field {i + 1} ({name}) is wrong: {reason}; it takes {SYNTAX} within {RANGES[i]}"
    reason = _parses(text)
    if reason is not None:
        return f"the fields never match a date ({reason}): check the day-of-month against the month"
    return None
