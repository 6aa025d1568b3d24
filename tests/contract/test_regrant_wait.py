"""The re-grant wait of the time model (docs/reliability.md "Time", domain/time_model.py): a run whose
lease expired while its attempt was started is retried no earlier than the expiry plus the attempt's
own TERM -> KILL grace plus the fence margin, when its old host's executor has stopped it."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import lease_expiry
from ql3.domain import time_model
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start


def _expired(harness: Harness, *, grace_ms: int, margin_ms: int | None = None) -> tuple[Any, Any, int]:
    """A started attempt of a retry-safe task with ``grace_ms``, its lease expired and the expiry run;
    returns (project, run, the lease's expiry instant). The database clock is frozen, so every
    instant below is exact on both databases."""
    harness.freeze_clock()
    register(harness.db, lease_ms=600_000)
    project, _, (run,) = queued(harness.db, max_attempts=3, retry_safe=True, grace_ms=grace_ms)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer)
    expires = int(
        harness.db.raw(f"SELECT expires_at_ms FROM run_leases WHERE attempt_id = '{offer.fence.attempt_id}'")[
            0
        ]["expires_at_ms"]
    )
    harness.advance_clock(30_001)
    margin = time_model.DEFAULT_FENCE_MARGIN_MS if margin_ms is None else margin_ms
    harness.db.transaction(
        lambda tx: lease_expiry.expire_lease(tx, offer.fence.attempt_id, fence_margin_ms=margin)
    )
    assert run_of(harness.db, project, run.id).status == "retry_wait"
    return project, run, expires


def _next_retry(harness: Harness, run_id: str) -> int:
    rows = harness.db.raw(f"SELECT next_retry_at_ms FROM run_retry_policies WHERE run_id = '{run_id}'")
    return int(rows[0]["next_retry_at_ms"])


@pytest.mark.parametrize(("grace_ms", "margin_ms"), [(20_000, None), (45_000, 7_000), (0, 500)])
def test_retry_waits_for_expiry_plus_grace_plus_margin(
    harness: Harness, grace_ms: int, margin_ms: int | None
) -> None:
    _project, run, expires = _expired(harness, grace_ms=grace_ms, margin_ms=margin_ms)
    margin = time_model.DEFAULT_FENCE_MARGIN_MS if margin_ms is None else margin_ms
    not_before = expires + grace_ms + time_model.rate_allowance_ms(grace_ms) + margin
    due = _next_retry(harness, run.id)
    assert due >= not_before
    # The backoff (1 s first) is shorter than every wait above: the wait decides, to the millisecond.
    assert due == max(not_before, harness.db.transaction(lambda tx: tx.now_ms(), write=False) + 1_000)


def test_no_attempt_is_admitted_before_the_regrant_instant(harness: Harness) -> None:
    project, run, expires = _expired(harness, grace_ms=20_000)
    not_before = expires + 20_000 + 203 + time_model.DEFAULT_FENCE_MARGIN_MS  # 203: 20 s at 1 % / 99 %
    now = harness.db.transaction(lambda tx: tx.now_ms(), write=False)
    harness.advance_clock(not_before - now - 1)
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id)) is None
    assert run_of(harness.db, project, run.id).status == "retry_wait"
    harness.advance_clock(1)
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id)) is not None
    assert run_of(harness.db, project, run.id).status == "queued"


def test_a_backoff_longer_than_the_wait_still_decides(harness: Harness) -> None:
    """The wait only ever delays a retry: the first backoff (1 s) beats a 0 ms grace plus 500 ms."""
    _project, run, expires = _expired(harness, grace_ms=0, margin_ms=500)
    now = harness.db.transaction(lambda tx: tx.now_ms(), write=False)
    assert expires + 500 < now + 1_000
    assert _next_retry(harness, run.id) == now + 1_000
