"""Human output: labelled local (or UTC) times, durations, short ids and status colours.

Only human output goes through here; ``--json`` keeps the API's fields (``*_ms``, full ids) as they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final, TextIO

SHORT_ID: Final = 13  # a UUIDv7's first 13 characters are its creation millisecond
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"

# ANSI SGR colours by run / approval / action status.
_RED, _GREEN, _YELLOW, _BLUE, _GREY = "31", "32", "33", "34", "90"
STATUS_COLOURS: Final[dict[str, str]] = {
    "succeeded": _GREEN,
    "approved": _GREEN,
    "consumed": _GREEN,
    "online": _GREEN,
    "failed": _RED,
    "timed_out": _RED,
    "lost": _RED,
    "rejected": _RED,
    "blocked": _RED,
    "recovery_required": _RED,
    "running": _BLUE,
    "dispatching": _BLUE,
    "executing": _BLUE,
    "queued": _YELLOW,
    "pending": _YELLOW,
    "retry_wait": _YELLOW,
    "waiting_approval": _YELLOW,
    "draining": _YELLOW,
    "cancelled": _GREY,
    "expired": _GREY,
    "offline": _GREY,
    "clear": _GREEN,
    "converging": _YELLOW,
    "attention_required": _RED,
}


def _zone(utc: bool) -> datetime:
    now = datetime.now(tz=UTC)
    return now if utc else now.astimezone()


def zone_label(utc: bool) -> str:
    """``UTC`` or the local zone's abbreviation (``CET``), else its offset (``+08:00``)."""
    if utc:
        return "UTC"
    local = _zone(False)
    name = local.tzname() or ""
    if name and not name.startswith(("+", "-")):
        return name
    offset = local.strftime("%z")
    return f"{offset[:3]}:{offset[3:]}" if offset else "local"


def when(ms: int | None, utc: bool, *, label: bool = True) -> str | None:
    """An epoch-ms instant as ``2026-12-01 09:16:17 CET`` (``label=False`` drops the zone)."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if not utc:
        moment = moment.astimezone()
    text = moment.strftime(TIME_FORMAT)
    return f"{text} {zone_label(utc)}" if label else text


def duration(ms: int | None) -> str | None:
    """``850ms``, ``12.5s``, ``10m``, ``1h 5m``, ``2d 3h``: two units at most."""
    if ms is None:
        return None
    if ms < 0:
        return None
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        seconds = ms / 1000
        return f"{seconds:.1f}s".replace(".0s", "s")
    total = ms // 1000
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    first = next(i for i, (n, _) in enumerate(parts) if n)
    shown = [f"{n}{unit}" for n, unit in parts[first : first + 2] if n]
    return " ".join(shown)


def run_duration(run: dict[str, object]) -> str | None:
    """How long a run has run: finished - started, or now - started while it runs."""
    started = run.get("started_at_ms")
    if not isinstance(started, int):
        return None
    finished = run.get("finished_at_ms")
    end = finished if isinstance(finished, int) else int(datetime.now(tz=UTC).timestamp() * 1000)
    return duration(max(0, end - started))


def short_ids(ids: Iterable[str]) -> dict[str, str]:
    """Each id cut to ``SHORT_ID`` characters, longer where that would not tell two of them apart."""
    unique = list(dict.fromkeys(ids))
    out: dict[str, str] = {}
    for value in unique:
        length = min(SHORT_ID, len(value))
        while length < len(value) and any(
            other != value and other.startswith(value[:length]) for other in unique
        ):
            length += 1
        out[value] = value[:length]
    return out


def colour_enabled(stream: TextIO | None = None) -> bool:
    """Colours on a terminal only; never when piped or when ``NO_COLOR`` is set (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    target = stream or sys.stdout
    isatty = getattr(target, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, status: str, enabled: bool) -> str:
    colour = STATUS_COLOURS.get(status)
    if not enabled or colour is None:
        return text
    return f"\x1b[{colour}m{text}\x1b[0m"
