"""What the approvals use cases check against storage, and the repository's own compare-and-set
writes: another project's request, a revoked principal, the policy fence's versions, stale writes."""

from __future__ import annotations

import pytest

from ql3.application import approvals, auth
from ql3.domain.approvals import policy_fence
from ql3.domain.errors import NotFound, PermissionDenied
from ql3.domain.ids import new_id
from ql3.repositories import approvals as approval_store
from ql3.repositories import auth as auth_store
from tests.support.approval_builders import approved, consume, decide, request, set_role, user, world
from tests.support.builders import count, seed_project
from tests.support.databases import Harness


def _stored(harness: Harness, approval_id: str) -> tuple[str, int]:
    found = harness.db.transaction(lambda tx: approval_store.get_approval(tx, approval_id), write=False)
    assert found is not None
    return found.state, found.version


def test_a_request_of_another_project_cannot_be_decided_there(harness: Harness) -> None:
    # Given a pending request in the default project and an approver of another project
    w = world(harness.db)
    req = request(w)
    other = seed_project(harness.db, "other")
    stranger = user(harness.db, other, "approver", "stranger")

    # When that approver decides it through their own project, it is not found and stays pending
    with pytest.raises(NotFound):
        harness.db.transaction(
            lambda tx: approvals.decide(
                tx,
                approval_id=req.id,
                project_id=other.id,
                decider=stranger,
                decider_role="approver",
                decision="approve",
                decision_id=new_id(),
                reason_code="looks_good",
            )
        )
    assert _stored(harness, req.id) == ("pending", 1)


def test_a_revoked_approver_cannot_decide(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)
    harness.db.transaction(lambda tx: auth_store.revoke_principal(tx, w.approver.id))

    with pytest.raises(PermissionDenied):
        decide(w, req.id)
    assert _stored(harness, req.id) == ("pending", 1)


def test_a_request_whose_requester_was_revoked_is_not_consumed(harness: Harness) -> None:
    w = world(harness.db)
    req = approved(w)
    harness.db.transaction(lambda tx: auth_store.revoke_principal(tx, w.requester.id))

    with pytest.raises(PermissionDenied):
        consume(w, req.id)
    assert _stored(harness, req.id) == ("approved", 2)
    assert count(harness.db, "approved_action_dispatches") == 0


def test_the_request_fence_holds_the_project_and_binding_versions_it_was_evaluated_at(
    harness: Harness,
) -> None:
    # Given a request, then the requester's role given again (the binding's version moves to 2)
    w = world(harness.db)
    first = request(w)
    set_role(harness.db, w.requester, w.project, "operator")
    second = request(w)

    # Then each request's fence names the versions current when it was made
    project = harness.db.transaction(lambda tx: auth.resolve_project(tx, w.project.id), write=False)
    assert first.request_fence == policy_fence(project.version, 1)
    assert second.request_fence == policy_fence(project.version, 2)


def test_writes_from_a_stale_read_of_a_request_change_nothing(harness: Harness) -> None:
    # Given a request read while pending, then decided and consumed
    w = world(harness.db)
    pending = request(w)
    decided = decide(w, pending.id)
    consume(w, decided.id)
    before = harness.db.raw("SELECT * FROM approval_requests WHERE id = ?", (pending.id,))

    # When the repository is asked to decide, consume or insert it again from the stale reads
    results = harness.db.transaction(
        lambda tx: (
            approval_store.decide_approval(
                tx,
                pending,
                decision="reject",
                decision_id=new_id(),
                reason_code="too_late",
                note=None,
                decided_by=w.approver.id,
                decision_fence="{}",
            ),
            approval_store.consume_approval(
                tx,
                decided,
                consumption_id=new_id(),
                dispatch_id=new_id(),
                consumed_by="system",
                consumption_fence="{}",
            ),
            approval_store.insert_approval(tx, pending),
        )
    )

    # Then every compare-and-set refuses and the row is as it was
    assert results == (False, False, False)
    assert harness.db.raw("SELECT * FROM approval_requests WHERE id = ?", (pending.id,)) == before
