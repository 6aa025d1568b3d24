"""The edges of one approved action in the dispatcher (``ApprovedActionDispatcher``): the claim carries
the dispatcher's own lease and attempt cap, a storage failure at the claim or at the dispatch read is
answered (and released for a retry) without executing, inspect runs in a read-only unit, a lease that
lapses during inspect refuses the start barrier, and an inspect failure is logged by its kind only."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ql3.application import approved_actions
from ql3.application.approved_action_runner import ApprovedActionDispatcher
from ql3.domain.approvals import Dispatch, retry_delay_ms
from ql3.ports.storage import Transaction
from tests.support.approval_builders import (
    LEASE_MS,
    CountingHandler,
    approved,
    consume,
    dispatched,
    execution,
    leased,
    runs_for,
    world,
)
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.interleaving import FailingUnit


def _dispatcher(db: Any, handler: Any = None, **kw: Any) -> ApprovedActionDispatcher:
    return ApprovedActionDispatcher(db, [handler or CountingHandler()], "replica-a", **kw)


def test_the_claim_leases_for_the_dispatchers_own_lease_time(harness: Harness) -> None:
    seen: list[tuple[int, int]] = []

    class Observing(CountingHandler):
        def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
            ex = approved_actions.get_execution(tx, dispatch.id)
            assert ex.lease_expires_at_ms is not None
            seen.append((ex.lease_expires_at_ms - ex.updated_at_ms, ex.attempt_count))
            return super().inspect(tx, dispatch)

    w = world(harness.db)
    dispatched(w)

    _dispatcher(harness.db, Observing(), lease_ms=45_000).dispatch_batch()

    assert seen == [(45_000, 1)]


def test_the_dispatchers_attempt_cap_exhausts_an_abandoned_lease_the_dispatch_would_retry(
    harness: Harness,
) -> None:
    # Given a dispatch allowed three attempts whose first lease another replica abandoned
    w = world(harness.db)
    dispatch = consume(w, approved(w).id, max_attempts=3)
    leased(harness.db, dispatch.id, owner="replica-b")
    harness.advance_clock(LEASE_MS)
    handler = CountingHandler()

    # When a dispatcher capped at one attempt takes it
    report = _dispatcher(harness.db, handler, max_attempts=1).dispatch_batch()

    # Then its claim finds the cap reached: blocked, never inspected or executed
    assert [i.outcome for i in report.items] == ["exhausted"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.attempt_count) == ("blocked", "attempts_exhausted", 1)
    assert (handler.inspected, handler.executed) == (0, 0)


def test_a_storage_failure_at_the_claim_is_answered_claim_failed(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    handler = CountingHandler()
    before = execution(harness.db, dispatch.id)

    # unit 1 reads the due page, unit 2 is the claim
    report = _dispatcher(FailingUnit(harness.db, 2), handler).dispatch_batch()

    assert [i.outcome for i in report.items] == ["claim_failed"]
    assert execution(harness.db, dispatch.id) == before
    assert (handler.inspected, handler.executed) == (0, 0)


def test_a_storage_failure_reading_the_dispatch_releases_it_for_a_retry(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    handler = CountingHandler()
    claimed_at = harness.now_ms()

    # unit 3 reads the dispatch after the claim
    report = _dispatcher(FailingUnit(harness.db, 3), handler).dispatch_batch()

    # Then the lease is given back before the barrier, due again after the first backoff
    assert [i.outcome for i in report.items] == ["retry_wait"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.attempt_count, ex.started_at_ms) == (
        "retry_wait",
        "dispatch_unavailable",
        1,
        None,
    )
    assert ex.next_attempt_at_ms is not None and ex.next_attempt_at_ms >= claimed_at + retry_delay_ms(1)
    if harness.dialect == "sqlite":
        assert ex.next_attempt_at_ms == claimed_at + retry_delay_ms(1)
    assert (handler.inspected, handler.executed) == (0, 0)


def test_inspect_runs_in_a_read_only_unit(harness: Harness) -> None:
    # Given a handler whose inspect tries to write
    class Sneaky(CountingHandler):
        def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
            ex = approved_actions.get_execution(tx, dispatch.id)
            tx.run(
                "aa_execution_renew_leased",
                {
                    "dispatch_id": ex.dispatch_id,
                    "expected_version": ex.version,
                    "lease_expires_at_ms": ex.lease_expires_at_ms,
                    "now": ex.updated_at_ms,
                },
            )
            return super().inspect(tx, dispatch)

    w = world(harness.db)
    dispatch = dispatched(w)
    handler = Sneaky()

    report = _dispatcher(harness.db, handler).dispatch_batch()

    # Then the write is refused, the inspection counts as unavailable and nothing ran
    assert [i.outcome for i in report.items] == ["retry_wait"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.version) == ("retry_wait", "inspect_unavailable", 2)
    assert handler.executed == 0 and count(harness.db, "runs") == 0


def test_a_lease_that_lapses_during_inspect_refuses_the_start_barrier(harness: Harness) -> None:
    class Slow(CountingHandler):
        def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
            harness.advance_clock(LEASE_MS)
            return super().inspect(tx, dispatch)

    w = world(harness.db)
    dispatch = dispatched(w)
    handler = Slow()

    report = _dispatcher(harness.db, handler).dispatch_batch()

    assert [i.outcome for i in report.items] == ["start_refused"]
    assert execution(harness.db, dispatch.id).status == "leased"
    assert handler.executed == 0 and runs_for(harness.db, dispatch.id) == []


def test_an_inspect_failure_is_logged_by_its_kind_only(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(CountingHandler):
        def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
            raise ConnectionError("secret-host:5432 refused")

    w = world(harness.db)
    dispatched(w)

    with caplog.at_level(logging.WARNING, logger="ql3.approved_actions.runner"):
        _dispatcher(harness.db, Failing()).dispatch_batch()

    (record,) = [r for r in caplog.records if r.name == "ql3.approved_actions.runner"]
    assert (record.getMessage(), record.__dict__["action"], record.__dict__["error"]) == (
        "inspect failed",
        "action.inspect_failed",
        "ConnectionError",
    )
    assert "secret-host" not in caplog.text
