"""The worker API's memory of a credential (cluster/auth_cache.py): at most a second, never past the
credential's expiry, only acceptances, bounded."""

from __future__ import annotations

import pytest

from ql3.application.auth import Authenticated
from ql3.cluster.auth_cache import REVOCATION_DELAY_S, WorkerAuthCache
from ql3.domain.errors import Unauthenticated
from ql3.domain.model import Principal


def _found(expires_at_ms: int | None = None, checked_at_ms: int = 1_000_000) -> Authenticated:
    principal = Principal(id="p1", name="w1", kind="worker", is_owner=False, created_at_ms=0)
    return Authenticated(
        principal=principal, needs_touch=False, expires_at_ms=expires_at_ms, checked_at_ms=checked_at_ms
    )


class Reads:
    def __init__(self, found: Authenticated | None = None) -> None:
        self.count = 0
        self.found = found or _found()
        self.refuse = False

    def __call__(self) -> tuple[Authenticated, str]:
        self.count += 1
        if self.refuse:
            raise Unauthenticated()
        return self.found, "w1"


def test_an_answer_is_kept_for_the_revocation_delay_and_no_longer() -> None:
    now = [100.0]
    cache = WorkerAuthCache(clock=lambda: now[0])
    reads = Reads()
    assert cache.worker_id("tok", reads) == "w1"
    assert cache.worker_id("tok", reads) == "w1"
    assert reads.count == 1
    reads.refuse = True  # revoked in the database
    now[0] += REVOCATION_DELAY_S - 0.001
    assert cache.worker_id("tok", reads) == "w1"
    now[0] += 0.001
    with pytest.raises(Unauthenticated):
        cache.worker_id("tok", reads)
    with pytest.raises(Unauthenticated):  # a refusal is read again every time
        cache.worker_id("tok", reads)
    assert reads.count == 3


def test_an_answer_never_outlives_the_credentials_expiry() -> None:
    now = [0.0]
    cache = WorkerAuthCache(clock=lambda: now[0])
    reads = Reads(_found(expires_at_ms=1_000_200, checked_at_ms=1_000_000))  # expires in 0.2 s
    cache.worker_id("tok", reads)
    now[0] = 0.199
    cache.worker_id("tok", reads)
    assert reads.count == 1
    now[0] = 0.2
    cache.worker_id("tok", reads)
    assert reads.count == 2


def test_tokens_are_told_apart_and_the_map_is_bounded() -> None:
    cache = WorkerAuthCache(max_entries=2, clock=lambda: 0.0)
    reads = Reads()
    for token in ("a", "b", "c"):
        cache.worker_id(token, reads)
    assert len(cache) == 2 and reads.count == 3
    cache.worker_id("a", reads)  # "a" was evicted: read again
    assert reads.count == 4
    cache.worker_id("c", reads)
    assert reads.count == 4


def test_a_malformed_token_is_never_remembered() -> None:
    cache = WorkerAuthCache(clock=lambda: 0.0)
    reads = Reads()
    cache.worker_id("", reads)
    cache.worker_id("", reads)
    assert reads.count == 2 and len(cache) == 0


def test_the_delay_cannot_be_configured_past_the_documented_bound() -> None:
    with pytest.raises(ValueError):
        WorkerAuthCache(delay_s=REVOCATION_DELAY_S + 0.5)
