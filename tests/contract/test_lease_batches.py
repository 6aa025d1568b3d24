"""Lease steps in batches (``InProcessControlPlane.run_batch``, docs/contracts.md "Batched lease
steps") on both databases: one transaction, an answer per step, one attempt's refusal never fails or
undoes another's step, a failure of the unit undoes every step; and the savepoints they stand on."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ql3.application import attempt_logs, gateway, runs
from ql3.application.attempt_logs import LogGap
from ql3.application.gateway import InProcessControlPlane
from ql3.domain.errors import Conflict, FenceConflict, StorageUnavailable, ValidationFailed
from ql3.domain.offers import LeaseFence
from ql3.ports.control_plane import MAX_BATCH_STEPS, LeaseCall
from ql3.ports.storage import Savepoints, Transaction
from ql3.repositories import projects as project_store
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, start


def _two_claimed(harness: Harness) -> tuple[LeaseFence, LeaseFence]:
    register(harness.db, lease_ms=600_000)
    queued(harness.db, n=2)
    fences = []
    for _ in range(2):
        offer = dispatcher(harness.db).dispatch_once().offer
        assert offer is not None
        fences.append(offer.fence)
    return fences[0], fences[1]


def _event_types(harness: Harness, run_id: str) -> list[str]:
    return [
        e.type for e in harness.db.transaction(lambda tx: runs.list_events(tx, run_id, after=0, limit=100))
    ]


def _starting(fence: LeaseFence) -> LeaseCall:
    return LeaseCall(step="ack_starting", fence=fence, args={})


def test_each_step_of_a_batch_has_its_own_answer_and_a_refusal_stays_with_its_step(harness: Harness) -> None:
    a, b = _two_claimed(harness)
    forged = dataclasses.replace(b, lease_token="not-the-token")
    plane = InProcessControlPlane(harness.db)

    answers = plane.run_batch([_starting(a), _starting(forged), _starting(a), _starting(b)])

    assert answers[0][0] == "starting"
    assert isinstance(answers[1], FenceConflict)
    assert answers[2][0] == "already_starting"  # the batch sees its own earlier step
    assert answers[3][0] == "starting"  # the refused step before it undid nothing of b's
    assert _event_types(harness, a.run_id).count("attempt.starting") == 1
    assert _event_types(harness, b.run_id).count("attempt.starting") == 1
    assert answers[0][1].remaining_ms is not None and answers[0][1].remaining_ms > 0


def test_a_batch_answers_what_the_single_calls_answer(harness: Harness) -> None:
    a, b = _two_claimed(harness)
    plane = InProcessControlPlane(harness.db)
    [status] = plane.run_batch([LeaseCall(step="lease_status", fence=a, args={})])
    single = plane.lease_status(a)
    assert (status.version, status.expires_at_ms) == (single.version, single.expires_at_ms)
    answers = plane.run_batch(
        [
            LeaseCall(step="renew", fence=a, args={"lease_ms": 60_000}),
            LeaseCall(step="report_lost", fence=b, args={"error_code": "LOST_TEST"}),
        ]
    )
    assert answers[0].version == a.lease_version + 1
    assert answers[1] is True
    assert "attempt.lost" in _event_types(harness, b.run_id)


def test_a_failure_of_the_unit_undoes_every_step(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _two_claimed(harness)

    def unavailable(tx: Transaction, fence: LeaseFence) -> Any:
        raise StorageUnavailable()

    monkeypatch.setitem(gateway._STEPS, "lease_status", unavailable)
    plane = InProcessControlPlane(harness.db)
    with pytest.raises(StorageUnavailable):
        plane.run_batch([_starting(a), LeaseCall(step="lease_status", fence=b, args={}), _starting(b)])
    # not an answer of one step: nothing of the batch committed, and a retry starts from scratch
    assert "attempt.starting" not in _event_types(harness, a.run_id)
    monkeypatch.undo()
    assert [x[0] for x in plane.run_batch([_starting(a), _starting(b)])] == ["starting", "starting"]


def test_a_batch_has_one_to_max_steps(harness: Harness) -> None:
    a, _ = _two_claimed(harness)
    plane = InProcessControlPlane(harness.db)
    with pytest.raises(ValidationFailed):
        plane.run_batch([])
    with pytest.raises(ValidationFailed):
        plane.run_batch([_starting(a)] * (MAX_BATCH_STEPS + 1))
    assert len(plane.run_batch([_starting(a)] * MAX_BATCH_STEPS)) == MAX_BATCH_STEPS


def _project_names(harness: Harness) -> set[str]:
    rows = harness.db.transaction(
        lambda tx: project_store.list_projects(tx, after="", limit=100), write=False
    )
    return {p.name for p in rows}


def test_a_savepoint_undoes_only_what_ran_inside_it(harness: Harness) -> None:
    def unit(tx: Transaction) -> str:
        assert isinstance(tx, Savepoints)
        project_store.insert_project(tx, project_id="p-keep", name="keep")

        def inside(t: Transaction) -> None:
            project_store.insert_project(t, project_id="p-undone", name="undone")
            raise ValueError("refused")

        with pytest.raises(ValueError):
            tx.savepoint(inside)
        return tx.savepoint(
            lambda t: "after" if project_store.insert_project(t, project_id="p-2", name="two") else ""
        )

    assert harness.db.transaction(unit) == "after"
    names = _project_names(harness)
    assert {"keep", "two"} <= names and "undone" not in names


def test_a_failed_statement_inside_a_savepoint_leaves_the_unit_usable(harness: Harness) -> None:
    row = {"kind": "user", "is_owner": 0, "token_digest": "d" * 64, "expires_at_ms": None, "issued_by": None}

    def unit(tx: Transaction) -> bool:
        assert isinstance(tx, Savepoints)
        tx.run("principal_insert", {"id": "pr-1", "name": "one", "now": tx.now_ms(), **row})
        with pytest.raises(Conflict):  # the same id again: the database refuses the statement
            tx.savepoint(
                lambda t: t.run("principal_insert", {"id": "pr-1", "name": "dup", "now": t.now_ms(), **row})
            )
        return project_store.insert_project(tx, project_id="p-after", name="after")

    assert harness.db.transaction(unit) is True
    assert "after" in _project_names(harness)


def test_the_last_log_chunk_and_the_completion_are_one_unit_and_a_refused_chunk_completes_anyway(
    harness: Harness,
) -> None:
    # Given two running attempts of one worker session
    register(harness.db, lease_ms=600_000)
    queued(harness.db, n=2)
    fences = []
    for _ in range(2):
        offer = dispatcher(harness.db).dispatch_once().offer
        assert offer is not None
        fences.append(start(harness.db, offer, token="cb-token"))
    a, b = fences
    plane = InProcessControlPlane(harness.db)

    def chunk(f: LeaseFence, offset: int, data: bytes) -> LeaseCall:
        args = {"offset": offset, "data": data, "final": True, "cap_bytes": 4096}
        return LeaseCall(step="append_log", fence=f, args=args)

    def done(f: LeaseFence) -> LeaseCall:
        args = {"callback_sequence": 1, "callback_token": "cb-token", "exit_code": 0}
        return LeaseCall(step="complete", fence=f, args=args)

    # When each completion travels with its log's last chunk, b's chunk starting past the stored end
    answers = plane.run_batch([chunk(a, 0, b"out\n"), done(a), chunk(b, 7, b"gap"), done(b)])

    # Then a's log is stored and closed with its completion, and b's refused chunk completed b anyway
    assert answers[0].outcome == "appended" and answers[0].head.closed
    assert isinstance(answers[2], LogGap) and answers[2].details["stored_bytes"] == 0
    assert answers[1] == answers[3] == ("applied", "succeeded")
    log = harness.db.transaction(lambda tx: attempt_logs.head(tx, a.attempt_id))
    assert log is not None and log.closed and log.stored_bytes == 4
    assert harness.db.transaction(lambda tx: attempt_logs.read(tx, log, 0, 100)).data == b"out\n"
    assert "run.succeeded" in _event_types(harness, b.run_id)
    # And a replay of the whole batch (a lost answer) changes nothing
    again = plane.run_batch([chunk(a, 0, b"out\n"), done(a)])
    assert again[0].outcome == "replayed" and again[1] == ("already_terminal", "succeeded")
