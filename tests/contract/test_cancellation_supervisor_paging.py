"""Cancellation supervisor paging: another server's intents never hide this server's own, a lap that
reaches the end reports ``complete`` (the loop then waits), and an oversized page fails closed."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import cancellation_supervisor
from ql3.storage.queries import catalogue
from tests.support.builders import count, seed_task, start_run
from tests.support.cancellation_builders import (
    LONG_MS,
    FakeSignal,
    request,
    running_runs,
    start_fence,
)
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, register


def _supervisor(db: Any, signal: Any, **budget: Any) -> cancellation_supervisor.CancellationSupervisor:
    return cancellation_supervisor.CancellationSupervisor(db, signal=signal, owner="sup-me", **budget)


def test_foreign_intents_ahead_never_starve_this_servers_own(harness: Harness) -> None:
    # Given four running runs of another server's worker (w1) and one of ours ("me"), all with
    # intents, the foreign ones first
    project, foreign = running_runs(harness.db, 4)
    register(harness.db, "me", slots=100, lease_ms=LONG_MS)
    task = seed_task(harness.db, project, name="mine")
    start_run(harness.db, project, task)
    offer = dispatcher(harness.db, lease_ms=LONG_MS).dispatch_once().offer
    assert offer is not None and offer.fence.worker_id == "me"
    start_fence(harness.db, offer.fence, 9)
    for fence in foreign:
        request(harness.db, project, fence.run_id)
        harness.advance_clock(1)
    request(harness.db, project, offer.fence.run_id)
    signal = FakeSignal()
    sup = _supervisor(harness.db, signal, page=2, pages=2, local_worker_id="me")

    # When the supervisor runs one cycle after another while they stop at page_limit
    first = sup.run_cycle()
    second = sup.run_cycle()

    # Then the second continues past the foreign intents, reaches ours and signals it
    assert (first.stop_reason, first.skipped, first.signals) == ("page_limit", {"other_worker": 4}, 0)
    assert (second.stop_reason, second.scanned, second.signals) == ("complete", 1, 1)
    assert [c[0] for c in signal.calls] == ["ql3lp1.handle-9"]
    # And the next lap starts at the first page again (the foreign ones are still there)
    third = sup.run_cycle()
    assert (third.stop_reason, third.skipped) == ("page_limit", {"other_worker": 4})


def test_an_oversized_intent_page_fails_the_cycle_closed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three runs with intents and a source that answers more rows than asked for
    project, fences = running_runs(harness.db, 3)
    for fence in fences:
        request(harness.db, project, fence.run_id)
        harness.advance_clock(1)
    real = cancellation_supervisor._intent_page

    def oversized(tx: Any, *, cursor: Any, limit: int) -> list[Any]:
        return real(tx, cursor=cursor, limit=limit + 1)

    monkeypatch.setattr(cancellation_supervisor, "_intent_page", oversized)
    signal = FakeSignal()

    # When a cycle runs with pages of two
    report = _supervisor(harness.db, signal, page=2).run_cycle()

    # Then nothing on that page is trusted: no claim, no signal, nothing written
    assert report.stop_reason == "oversized_page"
    assert (report.scanned, report.claimed, signal.calls) == (0, 0, [])
    assert count(harness.db, "cancellation_dispatches") == 0


def test_another_servers_due_dispatch_does_not_wake_this_supervisor(harness: Harness) -> None:
    # Given a running run of another server's worker (w1) whose supervisor failed to signal and then
    # went away: its dispatch waits for a retry that is now overdue
    project, (foreign,) = running_runs(harness.db, 1)
    register(harness.db, "me", slots=100, lease_ms=LONG_MS)
    start_run(harness.db, project, seed_task(harness.db, project, name="mine"))
    offer = dispatcher(harness.db, lease_ms=LONG_MS).dispatch_once().offer
    assert offer is not None and offer.fence.worker_id == "me"
    start_fence(harness.db, offer.fence, 9)
    request(harness.db, project, foreign.run_id)
    theirs = cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=None, owner="sup-w1", local_worker_id="w1"
    )
    assert theirs.run_cycle().results == {"controller_missing": 1}
    harness.advance_clock(120_000)
    ours = _supervisor(harness.db, FakeSignal(), local_worker_id="me")
    anyone = _supervisor(harness.db, FakeSignal())
    now = harness.now_ms()

    def wake(sup: cancellation_supervisor.CancellationSupervisor) -> int | None:
        found: int | None = harness.db.transaction(sup.next_wake_ms, write=False)
        return found

    # Then a supervisor of any attempt would wake at once for it, ours has nothing scheduled
    theirs_due = wake(anyone)
    assert theirs_due is not None and theirs_due <= now
    assert wake(ours) is None

    # And our own dispatch's backoff does wake ours, at its time
    request(harness.db, project, offer.fence.run_id)
    no_controller = cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=None, owner="sup-me", local_worker_id="me"
    )
    assert no_controller.run_cycle().results == {"controller_missing": 1}
    mine = harness.db.raw(
        "SELECT next_attempt_at_ms FROM cancellation_dispatches WHERE run_id = ?", (offer.fence.run_id,)
    )
    assert wake(ours) == int(mine[0]["next_attempt_at_ms"]) > now


@pytest.mark.parametrize("name", ["cancel_intent_first", "cancel_intent_after"])
def test_the_intent_pages_are_served_by_the_live_intent_index_not_by_the_backlog(
    harness: Harness, name: str
) -> None:
    # Given a queued backlog and one live intent
    project, fences = running_runs(harness.db, 1)
    task = seed_task(harness.db, project, name="backlog")
    for _ in range(20):
        start_run(harness.db, project, task)
    request(harness.db, project, fences[0].run_id)
    sql = catalogue(harness.dialect)[name]
    params = {"now": harness.now_ms(), "limit": 17, "c_ms": 0, "c_id": ""}

    # When the supervisor's page query is planned
    if harness.dialect == "sqlite":
        plan = [str(dict(r)) for r in harness.db._conn().execute("EXPLAIN QUERY PLAN " + sql, params)]
    else:
        with harness.db.pool.connection() as conn:
            conn.execute("SET enable_seqscan = off")
            plan = [str(r) for r in conn.execute(("EXPLAIN " + sql).encode(), params)]
            conn.execute("RESET enable_seqscan")

    # Then it reads the partial index of live intents (never runs_status, which holds every queued run:
    # a cost per cycle that grows with the backlog), and it still finds the intent
    text = "\n".join(plan)
    assert "runs_live_cancel_intent" in text and "runs_status" not in text, text
    rows = harness.db.transaction(lambda tx: tx.all(name, params), write=False)
    assert [r["run_id"] for r in rows] == [fences[0].run_id]
