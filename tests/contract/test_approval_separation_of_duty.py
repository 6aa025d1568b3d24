"""Separation of duty (docs/security.md): the decider is never the requester, never a principal whose
token the requester issued (directly, through others, or by rotating it), and under a project's
``second_admin`` policy an admin who did not issue the requester's token. An expired requester is
refused like a revoked one. Each refusal writes nothing."""

from __future__ import annotations

import pytest

from ql3.application import approvals, auth
from ql3.domain.approvals import RequesterNotAllowed, SeparationOfDuty
from ql3.domain.model import Principal, Project
from tests.support.approval_builders import World, decide, request, user, world
from tests.support.databases import Harness


def _issue(
    w: World, role: str, name: str, by: Principal | None, expires_in_s: int | None = None
) -> Principal:
    issued = w.db.transaction(
        lambda tx: auth.issue_token(
            tx, name=name, role=role, project=w.project, issued_by=by, expires_in_s=expires_in_s
        )
    )
    principal: Principal = issued.principal
    return principal


def _pending(w: World) -> tuple[str, int]:
    row = w.db.raw("SELECT state, version FROM approval_requests")[0]
    return str(row["state"]), int(row["version"])


def _set_policy(w: World, admin: Principal, project: Project, *, second_admin: bool) -> None:
    w.db.transaction(lambda tx: approvals.set_policy(tx, project, admin, second_admin=second_admin))


def test_an_admin_cannot_approve_its_own_request_through_a_token_it_minted(harness: Harness) -> None:
    # Given an admin who mints an approver token and asks for approval itself
    w = world(harness.db)
    admin = _issue(w, "admin", "admin", None)
    puppet = _issue(w, "approver", "puppet", admin)
    w.requester = admin
    pending = request(w)

    # When the minted approver approves it, it is refused and nothing is written
    with pytest.raises(SeparationOfDuty) as refused:
        decide(w, pending.id, decider=puppet)
    assert (refused.value.code, refused.value.http_status) == ("separation_of_duty", 403)
    assert _pending(w) == ("pending", 1)

    # And an approver the admin did not issue decides it
    assert decide(w, pending.id).state == "approved"


def test_the_lineage_is_followed_through_other_principals_and_rotations(harness: Harness) -> None:
    w = world(harness.db)
    admin = _issue(w, "admin", "admin", None)
    middle = _issue(w, "admin", "middle", admin)
    grandchild = _issue(w, "approver", "grandchild", middle)
    # An approver the admin did not create, whose token the admin then rotated (and so received)
    rotated = user(harness.db, w.project, "approver", "rotated")
    harness.db.transaction(lambda tx: auth.rotate_token(tx, admin, w.project, rotated.id))
    w.requester = admin
    pending = request(w)

    for decider in (grandchild, rotated):
        with pytest.raises(SeparationOfDuty):
            decide(w, pending.id, decider=decider)
    assert _pending(w) == ("pending", 1)


def test_rotating_ones_own_token_keeps_its_issuer(harness: Harness) -> None:
    w = world(harness.db)
    admin = _issue(w, "admin", "admin", None)
    puppet = _issue(w, "admin", "puppet", admin)
    harness.db.transaction(lambda tx: auth.rotate_token(tx, puppet, w.project, puppet.id))
    w.requester = admin
    pending = request(w)

    with pytest.raises(SeparationOfDuty):
        decide(w, pending.id, decider=puppet, role="admin")


def test_the_default_policy_lets_the_issuer_of_the_requester_decide(harness: Harness) -> None:
    # The owner-issued operator asks; the admin who issued that operator's token may decide (default)
    w = world(harness.db)
    admin = _issue(w, "admin", "admin", None)
    w.requester = _issue(w, "operator", "op", admin)
    pending = request(w)

    assert decide(w, pending.id, decider=admin, role="admin").state == "approved"


def test_second_admin_needs_an_admin_outside_the_requesters_lineage(harness: Harness) -> None:
    # Given a project requiring a second admin, and an operator issued by admin A
    w = world(harness.db)
    a = _issue(w, "admin", "a", None)
    b = _issue(w, "admin", "b", None)
    _set_policy(w, a, w.project, second_admin=True)
    w.requester = _issue(w, "operator", "op", a)
    pending = request(w)

    # When an approver (not an admin), or the admin who issued the requester's token, decides: refused
    with pytest.raises(SeparationOfDuty):
        decide(w, pending.id)
    with pytest.raises(SeparationOfDuty):
        decide(w, pending.id, decider=a, role="admin")
    assert _pending(w) == ("pending", 1)

    # Then an independent admin decides it; the policy reads back as set
    assert decide(w, pending.id, decider=b, role="admin").state == "approved"
    policy = harness.db.transaction(lambda tx: approvals.get_policy(tx, w.project), write=False)
    assert policy.second_admin and policy.version == 1


def test_an_expired_requesters_request_is_refused_when_approved(harness: Harness) -> None:
    # Given a pending request whose requester's token then expires
    w = world(harness.db)
    w.requester = _issue(w, "operator", "short", None, expires_in_s=60)
    pending = request(w)
    harness.advance_clock(61_000)

    # When an approver approves it, it is refused; rejecting it still closes it
    with pytest.raises(RequesterNotAllowed):
        decide(w, pending.id)
    assert _pending(w) == ("pending", 1)
    assert decide(w, pending.id, decision="reject", reason_code="requester_gone").state == "rejected"
