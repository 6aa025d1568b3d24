"""A request whose requester was revoked is refused when approved (docs/security.md), with a stable
code and nothing written; rejecting it still closes it."""

from __future__ import annotations

import pytest

from ql3.application import auth
from ql3.domain.approvals import RequesterNotAllowed
from tests.support.approval_builders import decide, request, user, world
from tests.support.databases import Harness


def test_approving_a_request_of_a_revoked_requester_is_refused_and_writes_nothing(harness: Harness) -> None:
    # Given a pending request whose requester was then revoked
    w = world(harness.db)
    pending = request(w)
    admin = user(harness.db, w.project, "admin", "admin")
    harness.db.transaction(lambda tx: auth.revoke_token(tx, admin, w.project, w.requester.id))

    # When an approver approves it, it is refused with a stable code
    with pytest.raises(RequesterNotAllowed) as refused:
        decide(w, pending.id)
    assert (refused.value.code, refused.value.http_status) == ("requester_not_allowed", 409)

    # Then nothing was written
    row = harness.db.raw("SELECT state, version, decided_by FROM approval_requests")[0]
    assert (row["state"], row["version"], row["decided_by"]) == ("pending", 1, None)

    # And rejecting it still closes it
    assert decide(w, pending.id, decision="reject", reason_code="requester_gone").state == "rejected"


def test_a_requester_who_lost_the_permission_is_refused_too(harness: Harness) -> None:
    w = world(harness.db)
    pending = request(w)
    harness.db.transaction(
        lambda tx: tx.run(
            "binding_upsert", {"principal_id": w.requester.id, "project_id": w.project.id, "role": "viewer"}
        )
    )

    with pytest.raises(RequesterNotAllowed):
        decide(w, pending.id)
