"""UUIDv7 identifiers (time-sortable, opaque, never carrying authority)."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
_UUID_RE = re.compile(UUID_PATTERN)
_lock = threading.Lock()
_last = [0, 0]


def new_id() -> str:
    """Return a new lowercase UUIDv7 string, monotonic within this process."""
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last[0]:
            ms = _last[0]
            seq = _last[1] + 1
            if seq > 0xFFF:
                ms += 1
                seq = 0
        else:
            seq = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _last[0], _last[1] = ms, seq
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))


def is_id(value: str) -> bool:
    """True when ``value`` is a canonical lowercase UUIDv7 string."""
    return bool(_UUID_RE.fullmatch(value))
