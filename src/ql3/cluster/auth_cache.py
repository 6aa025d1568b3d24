"""The worker API's short memory of who a worker credential is (docs/cluster.md "Credentials").

Every worker request used to read its credential from the database: a transaction per request, a
third of a cluster run's transactions. A worker sends many requests a second under load, so the
answer of one read is kept for at most ``REVOCATION_DELAY_S`` (and never past the credential's own
expiry): a revoked credential is refused by every replica within that delay. Only successful
answers are kept (a refused token is read again each time, so a token created a moment ago is never
refused from memory), keyed by the token's digest, never by the token itself; the map is bounded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ql3.application.auth import MAX_TOKEN_LENGTH, Authenticated
from ql3.domain.digests import API_TOKEN_DOMAIN, token_digest

REVOCATION_DELAY_S = 1.0  # the longest a revoked or expired worker credential is still accepted
MAX_ENTRIES = 1024  # distinct credentials remembered at once (oldest use evicted first)


@dataclass(frozen=True, slots=True)
class _Entry:
    worker_id: str
    valid_until: float  # monotonic seconds


class WorkerAuthCache:
    """Token digest -> worker id, each answer for at most ``REVOCATION_DELAY_S``."""

    def __init__(
        self,
        *,
        delay_s: float = REVOCATION_DELAY_S,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= delay_s <= REVOCATION_DELAY_S:
            raise ValueError("the revocation delay is at most REVOCATION_DELAY_S")
        if not 1 <= max_entries <= 65_536:
            raise ValueError("max_entries out of range")
        self._delay_s = delay_s
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def worker_id(self, token: str, read: Callable[[], tuple[Authenticated, str]]) -> str:
        """The worker id of ``token``: remembered, or ``read()`` (which raises for a refused token)."""
        if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
            return read()[1]  # refused there, and nothing of it remembered
        key = token_digest(API_TOKEN_DOMAIN, token)
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now < entry.valid_until:
                self._entries.move_to_end(key)
                return entry.worker_id
        found, worker_id = read()
        until = now + self._delay_s
        if found.expires_at_ms is not None:
            until = min(until, now + (found.expires_at_ms - found.checked_at_ms) / 1000.0)
        with self._lock:
            self._entries[key] = _Entry(worker_id=worker_id, valid_until=until)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return worker_id

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
