"""Deciding approvals: a user with approval.decide who is not the requester, before expiry, once."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import approvals
from ql3.domain.approvals import ApprovalExpired
from ql3.domain.errors import Conflict, FenceConflict, PermissionDenied, Ql3Error, ValidationFailed
from ql3.domain.ids import new_id
from tests.support.approval_builders import consume, decide, request, set_role, user, world
from tests.support.databases import Harness


def test_an_approver_approves_a_pending_request(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)
    decision_id = new_id()

    done = decide(w, req.id, decision_id=decision_id, reason_code="change_window_ok")

    assert (done.state, done.version) == ("approved", 2)
    assert (done.decision_id, done.decision, done.reason_code, done.decided_by) == (
        decision_id,
        "approve",
        "change_window_ok",
        w.approver.id,
    )
    assert done.decided_at_ms is not None and done.decided_at_ms < done.expires_at_ms
    assert done.decision_fence is not None


def test_a_rejected_request_is_terminal_and_cannot_be_consumed(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)

    done = decide(w, req.id, decision="reject", reason_code="too_risky")

    assert (done.state, done.version) == ("rejected", 2)
    with pytest.raises(Conflict):
        decide(w, req.id, decision="approve")
    with pytest.raises(Conflict):
        consume(w, req.id)
    assert harness.db.raw("SELECT count(*) AS n FROM approved_action_dispatches")[0]["n"] == 0


def test_the_requester_cannot_approve_their_own_request(harness: Harness) -> None:
    # Given an admin (who holds both run.create and approval.decide) asks for approval
    w = world(harness.db)
    admin = user(harness.db, w.project, "admin", "admin-requester")
    w.requester = admin
    req = request(w)

    # When that same admin tries to approve it, it is refused
    with pytest.raises(PermissionDenied):
        decide(w, req.id, decider=admin, role="admin")

    # Then the request is still pending
    assert decide(w, req.id).state == "approved"


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_roles_without_approval_decide_cannot_decide(harness: Harness, role: str) -> None:
    w = world(harness.db)
    req = request(w)
    someone = user(harness.db, w.project, role)

    with pytest.raises(PermissionDenied):
        decide(w, req.id, decider=someone, role=role)

    assert harness.db.raw("SELECT state FROM approval_requests")[0]["state"] == "pending"


def test_service_principals_never_decide_even_with_the_role(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)
    service = user(harness.db, w.project, "approver", "robot", kind="service")

    with pytest.raises(PermissionDenied):
        decide(w, req.id, decider=service)


def test_a_role_change_since_the_caller_resolved_it_fails_the_fence(harness: Harness) -> None:
    # Given an approver whose binding was downgraded after the caller resolved "approver"
    w = world(harness.db)
    req = request(w)
    set_role(harness.db, w.approver, w.project, "viewer")

    # When the stale role is presented, the fence fails; presenting the new role is simply denied
    with pytest.raises(FenceConflict):
        decide(w, req.id, role="approver")
    with pytest.raises(PermissionDenied):
        decide(w, req.id, role="viewer")
    assert harness.db.raw("SELECT state FROM approval_requests")[0]["state"] == "pending"


def test_decide_is_refused_at_the_expiry_instant(harness: Harness) -> None:
    # Given a request that expires in one minute
    w = world(harness.db)
    req = request(w, ttl_ms=60_000)

    # When the clock reaches expires_at exactly (SQLite) or just past it (the PostgreSQL clock runs)
    harness.advance_clock(req.expires_at_ms - harness.now_ms())
    assert harness.now_ms() >= req.expires_at_ms

    # Then deciding is refused and nothing changed
    with pytest.raises(ApprovalExpired):
        decide(w, req.id)
    row = harness.db.raw("SELECT state, version FROM approval_requests")[0]
    assert (row["state"], row["version"]) == ("pending", 1)


def test_decide_one_second_before_expiry_succeeds(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w, ttl_ms=60_000)
    harness.advance_clock(59_000)

    assert decide(w, req.id).state == "approved"


def test_an_exact_decision_replay_returns_the_row_and_any_drift_conflicts(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)
    decision_id = new_id()
    first = decide(w, req.id, decision_id=decision_id, reason_code="ok")

    assert decide(w, req.id, decision_id=decision_id, reason_code="ok") == first
    with pytest.raises(Conflict):
        decide(w, req.id, decision_id=decision_id, reason_code="other_reason")
    with pytest.raises(Conflict):
        decide(w, req.id, decision_id=decision_id, decision="reject", reason_code="ok")
    with pytest.raises(Conflict):
        decide(w, req.id, decision_id=new_id(), reason_code="ok")
    assert harness.db.raw("SELECT version FROM approval_requests")[0]["version"] == 2


def test_invalid_reason_codes_and_decisions_are_refused(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)

    for bad in ("Looks good", "1abc", "a" * 65, "", "ok-now"):
        with pytest.raises(ValidationFailed):
            decide(w, req.id, reason_code=bad)
    with pytest.raises(ValidationFailed):
        decide(w, req.id, decision="maybe")
    assert decide(w, req.id, reason_code="a" * 64).state == "approved"


def test_a_decide_race_on_two_connections_commits_once(harness: Harness) -> None:
    # Given a pending request and two approvers on two real connections
    w = world(harness.db)
    req = request(w)
    second_approver = user(harness.db, w.project, "approver", "approver-2")
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    results: list[Any] = [None, None]

    def race(i: int, db: Any, who: Any, decision: str) -> None:
        barrier.wait()
        try:
            results[i] = decide(w, req.id, decider=who, decision=decision, db=db)
        except Ql3Error as exc:
            results[i] = exc

    # When both decide at once, one approving and one rejecting
    threads = [
        threading.Thread(target=race, args=(0, harness.db, w.approver, "approve")),
        threading.Thread(target=race, args=(1, other, second_approver, "reject")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    other.close()

    # Then exactly one commits and the other gets a conflict
    winners = [r for r in results if not isinstance(r, Exception)]
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(winners) == 1 and len(losers) == 1, results
    row = harness.db.raw("SELECT state, version, decided_by FROM approval_requests")[0]
    assert (row["state"], row["version"]) == (winners[0].state, 2)
    assert row["decided_by"] == winners[0].decided_by


def test_a_decision_note_is_stored_and_shown_and_bad_notes_write_nothing(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)
    note = "Not in the change window — 変更は明日 " + "x" * 460

    for bad in ("line\nbreak", "tab\there", "bell\x07", "del\x7f", "c1\x85", "lone \ud800", "x" * 501):
        with pytest.raises(ValidationFailed):
            decide(w, req.id, decision="reject", reason_code="bad_timing", note=bad)
    assert harness.db.raw("SELECT state, decision_note FROM approval_requests")[0] == {
        "state": "pending",
        "decision_note": None,
    }

    decision_id = new_id()
    done = decide(w, req.id, decision="reject", reason_code="bad_timing", note=note, decision_id=decision_id)

    assert (done.state, done.reason_code, done.decision_note) == ("rejected", "bad_timing", note)
    assert harness.db.raw("SELECT decision_note FROM approval_requests")[0]["decision_note"] == note
    shown = harness.db.transaction(lambda tx: approvals.get_approval(tx, w.project.id, req.id), write=False)
    assert shown["note"] == note
    # the note is part of the decision's content: a replay must repeat it
    assert (
        decide(w, req.id, decision="reject", reason_code="bad_timing", note=note, decision_id=decision_id)
        == done
    )
    with pytest.raises(Conflict):
        decide(w, req.id, decision="reject", reason_code="bad_timing", note="other", decision_id=decision_id)


def test_an_approval_without_a_note_stores_none_and_an_empty_note_is_none(harness: Harness) -> None:
    w = world(harness.db)
    first, second = request(w), request(w)

    assert decide(w, first.id).decision_note is None
    assert decide(w, second.id, note="").decision_note is None
    assert [r["decision_note"] for r in harness.db.raw("SELECT decision_note FROM approval_requests")] == [
        None,
        None,
    ]


def test_the_schema_refuses_a_note_without_a_decision_or_over_the_bound(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)

    for sql in (
        "UPDATE approval_requests SET decision_note = 'early'",
        "UPDATE approval_requests SET decision_note = ''",
    ):
        with pytest.raises(Exception):  # noqa: B017 - each dialect raises its own integrity error
            harness.db.raw(sql)
    decide(w, req.id)
    with pytest.raises(Exception):  # noqa: B017
        harness.db.raw("UPDATE approval_requests SET decision_note = '" + "y" * 501 + "'")
    assert harness.db.raw("SELECT decision_note FROM approval_requests")[0]["decision_note"] is None


def test_the_view_names_the_bound_task_revision(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)

    shown = harness.db.transaction(lambda tx: approvals.get_approval(tx, w.project.id, req.id), write=False)

    assert shown["task_revision"] == w.task.revision
