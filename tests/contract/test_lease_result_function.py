"""A lease holder's results (the starting ACK, the running ACK, the completion) against every fence:
each refused with its exact reason and nothing written, and a draining worker's still applied. On
PostgreSQL each result goes first through one call of ``ql3_lease_result`` (migration 0014), which
must write only when every fence holds and otherwise defer to the statement-by-statement path that
names the reason (docs/dispatch.md, "Dispatch on PostgreSQL: round trips")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest

from ql3.application import lease_results, workers
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import Conflict, FenceConflict, InvalidRunTransition, NotFound
from ql3.domain.offers import LeaseFence
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, start

RESULTS = ["starting", "running", "complete"]
RUN_LEASE_MS = 30_000
SESSION_MS = 5_000
OTHER_ID = "01a00000-0000-7000-8000-0000000000cc"


def _at(harness: Harness, result: str, *, session_ms: int = SESSION_MS) -> tuple[LeaseFence, str]:
    """A run whose next step is ``result``, and the id of another run of the same task; the clock
    frozen, so that advancing it by a lease's duration lands exactly on its expiry."""
    harness.freeze_clock()
    register(harness.db, lease_ms=session_ms)
    _, _, created = queued(harness.db, n=2)
    offer = dispatcher(harness.db, lease_ms=RUN_LEASE_MS).dispatch_once().offer
    assert offer is not None
    fence = offer.fence
    if result == "running":
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    if result == "complete":
        start(harness.db, offer)
    other = next(r.id for r in created if r.id != fence.run_id)
    return fence, other


def _step(harness: Harness, result: str, fence: LeaseFence) -> Any:
    def run(tx: Any) -> Any:
        if result == "starting":
            return lease_results.ack_starting(tx, fence)[0]
        if result == "running":
            return lease_results.ack_running(
                tx,
                fence,
                pid=4242,
                handle="ql3lp1.test",
                log_artifact_id="a",
                callback_sequence=1,
                callback_token_digest=sha256_hex("cb-token"),
            )[0]
        return lease_results.complete(tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0)

    return harness.db.transaction(run)


def _state(harness: Harness) -> list[Any]:
    """Everything a result writes: events, attempts, runs, leases and the worker's counter."""
    return [
        count(harness.db, "run_events"),
        harness.db.raw("SELECT id, status, callback_sequence, deadline_at_ms FROM run_attempts ORDER BY id"),
        harness.db.raw("SELECT id, status, version FROM runs ORDER BY id"),
        harness.db.raw("SELECT attempt_id, status, version FROM run_leases ORDER BY attempt_id"),
        harness.db.raw("SELECT active_leases FROM workers"),
    ]


FENCE_CHANGES: dict[str, tuple[Callable[[LeaseFence, str], LeaseFence], str]] = {
    "run": (lambda f, other: replace(f, run_id=other), "run_mismatch"),
    "worker": (lambda f, _: replace(f, worker_id="w9"), "worker_mismatch"),
    "session": (lambda f, _: replace(f, session_id=OTHER_ID), "worker_session_mismatch"),
    "worker_generation": (
        lambda f, _: replace(f, worker_generation=f.worker_generation + 1),
        "worker_generation_mismatch",
    ),
    "lease_generation": (
        lambda f, _: replace(f, lease_generation=f.lease_generation + 1),
        "lease_generation_mismatch",
    ),
    "token": (lambda f, _: replace(f, lease_token="0" * len(f.lease_token)), "lease_token_mismatch"),
}

ROW_CHANGES: dict[str, tuple[Callable[[Harness], None], str]] = {
    "lease_released": (
        lambda h: h.db.raw(
            "UPDATE run_leases SET status = 'released', version = version + 1,"
            " released_at_ms = acquired_at_ms, release_reason = 'lease_expired'"
        ),
        "not_leased",
    ),
    "lease_expired": (lambda h: h.advance_clock(RUN_LEASE_MS), "lease_expired"),
    "worker_offline": (
        lambda h: h.db.raw("UPDATE workers SET status = 'offline' WHERE worker_id = 'w1'"),
        "worker_unavailable",
    ),
    "worker_restarted": (
        lambda h: h.db.raw("UPDATE workers SET generation = generation + 1 WHERE worker_id = 'w1'"),
        "worker_unavailable",
    ),
    "worker_session_ended": (lambda h: h.advance_clock(SESSION_MS), "worker_unavailable"),
}


@pytest.mark.parametrize("change", list(FENCE_CHANGES))
@pytest.mark.parametrize("result", RESULTS)
def test_a_result_with_a_wrong_fence_is_refused_with_its_reason_and_writes_nothing(
    harness: Harness, result: str, change: str
) -> None:
    # Given a run at the step ``result``, and a fence that differs from its lease in one part
    fence, other = _at(harness, result)
    wrong, reason = FENCE_CHANGES[change]
    before = _state(harness)

    # When the result comes with that fence
    with pytest.raises(FenceConflict) as caught:
        _step(harness, result, wrong(fence, other))

    # Then it is refused with the part's reason, and nothing changed
    assert caught.value.details["reason"] == reason
    assert _state(harness) == before


# A completion needs no live lease: whatever became of its lease or its worker's session, it is the
# fact of the attempt it ends (docs/contracts.md §2.4; tests/contract/test_late_facts.py).
ACKS = ["starting", "running"]


@pytest.mark.parametrize("change", list(ROW_CHANGES))
def test_a_completion_whose_lease_or_worker_changed_is_still_its_attempts_fact(
    harness: Harness, change: str
) -> None:
    # Given a running run whose lease or worker then changed
    fence, _ = _at(
        harness, "complete", session_ms=10 * RUN_LEASE_MS if change == "lease_expired" else SESSION_MS
    )
    alter, _ = ROW_CHANGES[change]
    alter(harness)

    # When its receipt comes with the fence it was offered
    assert _step(harness, "complete", fence) == ("applied", "succeeded")

    # Then the run took its outcome, and no lease of it is left live
    assert harness.db.raw("SELECT status, exit_code FROM runs WHERE id = ?", (fence.run_id,)) == [
        {"status": "succeeded", "exit_code": 0}
    ]
    assert harness.db.raw("SELECT status FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))[0][
        "status"
    ] in ("completed", "released")


@pytest.mark.parametrize("change", list(ROW_CHANGES))
@pytest.mark.parametrize("result", ACKS)
def test_a_result_whose_lease_or_worker_changed_is_refused_with_its_reason_and_writes_nothing(
    harness: Harness, result: str, change: str
) -> None:
    # Given a run at the step ``result`` whose lease or worker then changed
    # (an expired lease of a worker whose session is still live: only the lease's expiry refuses it)
    fence, _ = _at(harness, result, session_ms=10 * RUN_LEASE_MS if change == "lease_expired" else SESSION_MS)
    alter, reason = ROW_CHANGES[change]
    alter(harness)
    before = _state(harness)

    # When the result comes with the fence it was offered
    with pytest.raises(FenceConflict) as caught:
        _step(harness, result, fence)

    # Then it is refused with the reason, and nothing changed
    assert caught.value.details["reason"] == reason
    assert _state(harness) == before


# States no public path makes, where the lease and the worker row disagree in one part while the fence
# matches the other: each check of the lease and of the worker stands on its own, so the one-statement
# form must refuse (defer) wherever the statement-by-statement path does.
SPLIT_ROWS: dict[str, tuple[Callable[[Harness], Any], Callable[[LeaseFence, str], LeaseFence], str]] = {
    "worker_row_session": (
        lambda h: h.db.raw(f"UPDATE workers SET session_id = '{OTHER_ID}' WHERE worker_id = 'w1'"),
        lambda f, _: replace(f, session_id=OTHER_ID),
        "worker_session_mismatch",
    ),
    "worker_row_generation": (
        lambda h: h.db.raw("UPDATE workers SET generation = generation + 1 WHERE worker_id = 'w1'"),
        lambda f, _: replace(f, worker_generation=f.worker_generation + 1),
        "worker_generation_mismatch",
    ),
    "lease_row_session": (
        lambda h: h.db.raw(f"UPDATE run_leases SET worker_session_id = '{OTHER_ID}'"),
        lambda f, _: replace(f, session_id=OTHER_ID),
        "worker_unavailable",
    ),
    "lease_row_worker": (
        lambda h: (register(h.db, "w9"), h.db.raw("UPDATE run_leases SET worker_id = 'w9'")),
        lambda f, _: f,
        "worker_mismatch",
    ),
}


@pytest.mark.parametrize(
    ("split", "result"),
    # A completion by the lease's holder whose worker row moved on is its attempt's fact (above).
    [(split, r) for split in SPLIT_ROWS for r in RESULTS if (split, r) != ("lease_row_session", "complete")],
)
def test_a_result_is_refused_when_the_lease_and_the_worker_row_disagree_in_one_part(
    harness: Harness, result: str, split: str
) -> None:
    # Given a run at the step ``result`` whose lease and worker row were made to disagree, and a fence
    # that matches one of them
    fence, other = _at(harness, result)
    alter, fenced, reason = SPLIT_ROWS[split]
    alter(harness)
    before = _state(harness)

    # When the result comes with that fence
    with pytest.raises(FenceConflict) as caught:
        _step(harness, result, fenced(fence, other))

    # Then the part that disagrees refuses it, and nothing changed
    assert caught.value.details["reason"] == reason
    assert _state(harness) == before


@pytest.mark.parametrize("result", RESULTS)
def test_a_result_changes_only_its_own_run_when_another_is_at_the_same_step(
    harness: Harness, result: str
) -> None:
    # Given two runs of one worker at the step ``result``, their rows at the same versions
    harness.freeze_clock()
    register(harness.db, lease_ms=SESSION_MS)
    queued(harness.db, n=2)
    offers = dispatcher(harness.db, lease_ms=RUN_LEASE_MS, max_offers_per_cycle=2).dispatch_once().offers
    assert len(offers) == 2
    for offer in offers:
        if result == "running":
            harness.db.transaction(lambda tx, f=offer.fence: lease_results.ack_starting(tx, f))
        if result == "complete":
            start(harness.db, offer)
    mine, theirs = offers[0].fence, offers[1].fence

    def rows_of(run_id: str) -> list[Any]:
        return [
            harness.db.raw("SELECT status, version, event_sequence FROM runs WHERE id = ?", (run_id,)),
            harness.db.raw("SELECT status, callback_sequence FROM run_attempts WHERE run_id = ?", (run_id,)),
            harness.db.raw("SELECT status, version FROM run_leases WHERE run_id = ?", (run_id,)),
            harness.db.raw("SELECT count(*) AS n FROM run_events WHERE run_id = ?", (run_id,)),
        ]

    assert rows_of(mine.run_id) == rows_of(theirs.run_id)
    before = rows_of(theirs.run_id)

    # When the result of one of them comes
    _step(harness, result, mine)

    # Then the other run, its attempt, lease and events are as they were
    assert rows_of(theirs.run_id) == before
    assert rows_of(mine.run_id) != before


@pytest.mark.parametrize(
    ("reason", "outcome", "error_code"),
    [("timeout", "timed_out", "EXECUTION_TIMED_OUT"), ("user", "cancelled", "EXECUTION_CANCELLED")],
)
def test_a_completion_after_a_committed_cancel_intent_takes_the_intents_outcome(
    harness: Harness, reason: str, outcome: str, error_code: str
) -> None:
    # Given a running run whose cancel intent (a timeout, or a user's cancel) is committed
    fence, _ = _at(harness, "complete")
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = created_at_ms, cancel_reason = ? WHERE id = ?",
        (reason, fence.run_id),
    )

    # When its command's exit 0 is reported
    answer = _step(harness, "complete", fence)

    # Then the intent decides the outcome and its error code, not the exit status
    assert answer == ("applied", outcome)
    (run,) = harness.db.raw("SELECT status, error_code, exit_code FROM runs WHERE id = ?", (fence.run_id,))
    assert (run["status"], run["error_code"], run["exit_code"]) == (outcome, error_code, 0)


@pytest.mark.parametrize("result", RESULTS)
def test_a_draining_worker_still_reports_the_results_of_what_it_holds(harness: Harness, result: str) -> None:
    # Given a run at the step ``result`` whose worker is draining
    fence, _ = _at(harness, result)
    harness.db.transaction(lambda tx: workers.drain(tx, "w1"))

    # When the result comes, then it applies
    expected = {"starting": "starting", "running": "running", "complete": ("applied", "succeeded")}
    assert _step(harness, result, fence) == expected[result]


def test_each_result_moves_the_run_and_lease_versions_as_the_statement_path_does(harness: Harness) -> None:
    # Given a claimed run
    fence, _ = _at(harness, "starting")

    def versions() -> tuple[int, int]:
        (run,) = harness.db.raw("SELECT version FROM runs WHERE id = ?", (fence.run_id,))
        (lease,) = harness.db.raw("SELECT version FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))
        return int(run["version"]), int(lease["version"])

    # When its results come one after another
    seen = [versions()]
    for result in RESULTS:
        _step(harness, result, fence)
        seen.append(versions())

    # Then each one moves the run's version by one, and only the completion moves the lease's (a
    # start-failure replay after a completion is told apart by the lease version + 1)
    steps = [(after[0] - before[0], after[1] - before[1]) for before, after in pairwise(seen)]
    assert steps == [(1, 0), (1, 0), (1, 1)]


# States the foreign keys and the life cycle rule out, made with those checks off (``Harness.forge``):
# a row the result reads is gone, or names another run, or the run and its attempt disagree. The
# one-statement form's own checks of these must hold without the keys behind them: it defers, writing
# nothing, and the statement-by-statement path refuses as it does on SQLite, with the same error.
_ALL = dict.fromkeys(RESULTS)
FORGED: dict[str, tuple[str, dict[str, tuple[type[Exception], dict[str, Any]]]]] = {
    "run_row_gone": ("DELETE FROM runs WHERE id = '{run}'", {r: (NotFound, {}) for r in _ALL}),
    "attempt_row_gone": (
        "DELETE FROM run_attempts WHERE id = '{attempt}'",
        {r: (NotFound, {}) for r in _ALL},
    ),
    "attempt_of_another_run": (
        "UPDATE run_attempts SET run_id = '{other}', attempt = attempt + 100 WHERE id = '{attempt}'",
        {r: (FenceConflict, {"reason": "run_mismatch"}) for r in _ALL},
    ),
    "lease_row_gone": (
        "DELETE FROM run_leases WHERE attempt_id = '{attempt}'",
        {r: (FenceConflict, {"reason": "missing"}) for r in _ALL},
    ),
    "lease_of_another_run": (
        "UPDATE run_leases SET run_id = '{other}' WHERE attempt_id = '{attempt}'",
        {r: (FenceConflict, {"reason": "run_mismatch"}) for r in _ALL},
    ),
    "worker_row_gone": (  # a completion needs no worker session: it applies (above)
        "DELETE FROM workers WHERE worker_id = '{worker}'",
        {r: (FenceConflict, {"reason": "worker_unavailable"}) for r in ACKS},
    ),
    "task_revision_gone": ("DELETE FROM task_revisions", {"starting": (NotFound, {})}),
    "run_queued_again": (
        "UPDATE runs SET status = 'queued' WHERE id = '{run}'",
        {
            "starting": (Conflict, {"status": "claimed"}),
            "running": (InvalidRunTransition, {"status": "queued", "to": "running"}),
        },
    ),
    "attempt_back_to_starting": (
        "UPDATE run_attempts SET status = 'starting' WHERE id = '{attempt}'",
        {"complete": (InvalidRunTransition, {"status": "starting", "to": "succeeded"})},
    ),
    "callback_digest_gone": (
        "UPDATE run_attempts SET callback_token_hash = NULL WHERE id = '{attempt}'",
        {"complete": (FenceConflict, {"reason": "running_ack_missing"})},
    ),
}


@pytest.mark.parametrize(
    ("forged", "result"), [(name, result) for name, (_, refusals) in FORGED.items() for result in refusals]
)
def test_a_result_on_a_forged_state_is_refused_as_the_statement_path_refuses_it_and_writes_nothing(
    harness: Harness, forged: str, result: str
) -> None:
    # Given a run at the step ``result`` whose rows were then forged into a state no path makes
    fence, other = _at(harness, result)
    sql, refusals = FORGED[forged]
    harness.forge(sql.format(run=fence.run_id, attempt=fence.attempt_id, other=other, worker=fence.worker_id))
    before = _state(harness)

    # When the result comes with the fence it was offered
    with pytest.raises(Exception) as caught:
        _step(harness, result, fence)

    # Then it is refused with the statement path's error (the same on both databases), and nothing
    # changed
    error, details = refusals[result]
    assert (type(caught.value), getattr(caught.value, "details", None)) == (error, details)
    assert _state(harness) == before
