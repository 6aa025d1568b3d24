"""Time zones of cron schedules (docs/tasks.md "Time zones").

A task's zone travels inside its cron expression as a ``CRON_TZ=ZONE`` prefix (the cronie / Vixie
cron spelling), so a revision's content, its digest and ``next_fire_ms(expr, after_ms)`` carry it
without another field. An expression without the prefix is evaluated in UTC, as every schedule was
before zones existed: an upgrade changes no schedule.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ql3.domain.errors import ValidationFailed

PREFIX: Final = "CRON_TZ="
DEFAULT_ZONE: Final = "UTC"
MAX_ZONE_CHARS: Final = 64
# IANA names: Area/Location[/Sub], letters, digits, '_', '-', '+' (Etc/GMT+8); no '..' and no leading '/'.
_ZONE_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9][A-Za-z0-9_+-]*){0,2}$")
ZONE_HINT: Final = "an IANA time zone name such as Asia/Shanghai, Europe/Berlin or UTC"


def zone_problem(name: object) -> str | None:
    """None when ``name`` is a time zone this host knows, else why not (one sentence)."""
    if not isinstance(name, str) or not name or len(name) > MAX_ZONE_CHARS or not _ZONE_RE.fullmatch(name):
        return f"{str(name)[:MAX_ZONE_CHARS]!r} is not a time zone name; use {ZONE_HINT}"
    try:
        _zone(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {name!r}; use {ZONE_HINT}"
    return None


def validate_zone(name: object, what: str = "tz") -> str:
    problem = zone_problem(name)
    if problem is not None:
        raise ValidationFailed(problem, field=what)
    assert isinstance(name, str)
    return name


@lru_cache(maxsize=256)
def _zone(name: str) -> tzinfo:
    return UTC if name == DEFAULT_ZONE else ZoneInfo(name)


def zone(name: str) -> tzinfo:
    """The ``tzinfo`` of a validated zone name."""
    return _zone(name)


def split_cron(expr: str) -> tuple[str | None, str]:
    """``("Asia/Shanghai", "0 8 * * *")`` for ``"CRON_TZ=Asia/Shanghai 0 8 * * *"``; no prefix: None."""
    text = expr.strip()
    if not text.startswith(PREFIX):
        return None, text
    head, _, rest = text.partition(" ")
    return head[len(PREFIX) :], rest.strip()


def join_cron(zone_name: str | None, body: str) -> str:
    """The stored form: the fields alone (UTC) or ``CRON_TZ=ZONE`` and the fields."""
    fields = " ".join(body.split())
    return fields if zone_name is None else f"{PREFIX}{zone_name} {fields}"


def zone_of(expr: str | None) -> str:
    """The zone a stored cron expression is evaluated in (``UTC`` without a prefix)."""
    if expr is None:
        return DEFAULT_ZONE
    name, _ = split_cron(expr)
    return name or DEFAULT_ZONE


def local_iso(ms: int, zone_name: str) -> str:
    """An epoch-ms instant as wall time in the zone, with its offset: ``2026-12-05T08:00:00+08:00``."""
    return datetime.fromtimestamp(ms / 1000, tz=zone(zone_name)).isoformat(timespec="seconds")
