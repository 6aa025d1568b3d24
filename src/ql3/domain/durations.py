"""Durations as people write them (docs/tasks.md "Durations"): ``90`` (seconds), ``2.5``, ``90s``,
``5m``, ``1h30m``, ``2d``, ``500ms``, ``1w``; accepted wherever the CLI and the console take seconds."""

from __future__ import annotations

import re
from typing import Final

from ql3.domain.errors import ValidationFailed

UNIT_MS: Final = {"w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
_ORDER: Final = tuple(UNIT_MS)  # each unit at most once, largest first
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|[wdhms])")
_SECONDS: Final = re.compile(r"\d+(?:\.\d+)?")
MAX_DURATION_MS: Final = 10**12  # about 31 years: far beyond any limit a caller then applies
DURATION_HINT: Final = "seconds (90, 2.5) or units largest first: 90s, 5m, 1h30m, 2d, 500ms"


def parse_duration_ms(text: object, what: str = "duration") -> int:
    """``text`` in milliseconds (rounded, at least 0); refused with the accepted forms named."""
    refused = ValidationFailed(f"invalid {what} {str(text)[:32]!r}: write {DURATION_HINT}", field=what)
    if not isinstance(text, str):
        raise refused
    compact = re.sub(r"(?<=[a-z])\s+", "", text.strip())  # "1h 5m", as ql3 prints durations
    if _SECONDS.fullmatch(compact):
        total = float(compact) * 1000
    else:
        total = 0.0
        position, last = 0, -1
        for match in _PART.finditer(compact):
            unit = _ORDER.index(match.group(2))
            if match.start() != position or unit <= last:
                raise refused
            total += float(match.group(1)) * UNIT_MS[match.group(2)]
            position, last = match.end(), unit
        if last < 0 or position != len(compact):
            raise refused
    if total > MAX_DURATION_MS:
        raise refused
    return round(total)
