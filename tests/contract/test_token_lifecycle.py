"""Tokens are listed, revoked, expired and rotated; revocation and rotation take effect at once."""

from __future__ import annotations

import pytest

from ql3.application import auth
from ql3.domain.errors import Conflict, NotFound, PermissionDenied, Unauthenticated, ValidationFailed
from ql3.domain.model import Project
from tests.support.builders import seed_project
from tests.support.databases import Harness


def _owner(harness: Harness) -> auth.IssuedToken:
    issued: auth.IssuedToken | None = harness.db.transaction(auth.bootstrap_owner)
    assert issued is not None
    return issued


def _issue(harness: Harness, project: Project, role: str = "viewer", **kw: object) -> auth.IssuedToken:
    issued: auth.IssuedToken = harness.db.transaction(
        lambda tx: auth.issue_token(tx, name="member", role=role, project=project, **kw)  # type: ignore[arg-type]
    )
    return issued


def _authenticate(harness: Harness, token: str) -> str:
    principal = harness.db.transaction(lambda tx: auth.authenticate(tx, token), write=False)
    return str(principal.id)


def test_a_revoked_token_is_refused_at_once_and_listed_as_revoked(harness: Harness) -> None:
    owner = _owner(harness)
    member = _issue(harness, owner.project)
    assert _authenticate(harness, member.token) == member.principal.id

    record = harness.db.transaction(
        lambda tx: auth.revoke_token(tx, owner.principal, owner.project, member.principal.id)
    )

    assert record.revoked_at_ms is not None
    with pytest.raises(Unauthenticated):
        _authenticate(harness, member.token)
    listed = harness.db.transaction(lambda tx: auth.list_tokens(tx, owner.project), write=False)
    by_id = {r.id: r for r in listed}
    assert by_id[member.principal.id].revoked_at_ms == record.revoked_at_ms
    assert by_id[owner.principal.id].revoked_at_ms is None and by_id[owner.principal.id].role == "admin"
    # repeating the revocation changes nothing
    again = harness.db.transaction(
        lambda tx: auth.revoke_token(tx, owner.principal, owner.project, member.principal.id)
    )
    assert again.revoked_at_ms == record.revoked_at_ms


def test_an_expired_token_is_refused(harness: Harness) -> None:
    owner = _owner(harness)
    before = harness.now_ms()
    member = _issue(harness, owner.project, expires_in_s=60)
    assert member.expires_at_ms is not None
    assert before + 60_000 <= member.expires_at_ms <= harness.now_ms() + 60_000
    assert _authenticate(harness, member.token) == member.principal.id

    harness.advance_clock(60_000)

    with pytest.raises(Unauthenticated):
        _authenticate(harness, member.token)


@pytest.mark.parametrize("bad", [0, 59, True, 10**12, "60"])
def test_an_out_of_range_lifetime_is_refused_and_writes_nothing(harness: Harness, bad: object) -> None:
    owner = _owner(harness)
    before = len(harness.db.transaction(lambda tx: auth.list_tokens(tx, owner.project), write=False))

    with pytest.raises(ValidationFailed):
        _issue(harness, owner.project, expires_in_s=bad)

    assert len(harness.db.transaction(lambda tx: auth.list_tokens(tx, owner.project), write=False)) == before


def test_rotation_replaces_the_token_and_keeps_principal_role_and_lifetime(harness: Harness) -> None:
    owner = _owner(harness)
    member = _issue(harness, owner.project, role="operator", expires_in_s=3600)
    harness.advance_clock(1000)
    before = harness.now_ms()

    rotated = harness.db.transaction(
        lambda tx: auth.rotate_token(tx, owner.principal, owner.project, member.principal.id)
    )

    assert rotated.token != member.token
    with pytest.raises(Unauthenticated):
        _authenticate(harness, member.token)
    assert _authenticate(harness, rotated.token) == member.principal.id
    assert rotated.record.role == "operator"
    assert rotated.record.expires_at_ms is not None
    assert before + 3_600_000 <= rotated.record.expires_at_ms <= harness.now_ms() + 3_600_000


def test_the_owner_rotates_its_own_token_but_cannot_revoke_itself(harness: Harness) -> None:
    owner = _owner(harness)

    rotated = harness.db.transaction(
        lambda tx: auth.rotate_token(tx, owner.principal, owner.project, owner.principal.id)
    )

    assert _authenticate(harness, rotated.token) == owner.principal.id
    with pytest.raises(Unauthenticated):
        _authenticate(harness, owner.token)
    with pytest.raises(Conflict):
        harness.db.transaction(
            lambda tx: auth.revoke_token(tx, owner.principal, owner.project, owner.principal.id)
        )


def test_an_admin_cannot_rotate_or_revoke_the_owner(harness: Harness) -> None:
    owner = _owner(harness)
    admin = _issue(harness, owner.project, role="admin")

    for operation in (auth.rotate_token, auth.revoke_token):
        with pytest.raises(PermissionDenied):
            harness.db.transaction(
                lambda tx, op=operation: op(tx, admin.principal, owner.project, owner.principal.id)
            )
    assert _authenticate(harness, owner.token) == owner.principal.id


def test_a_token_of_another_project_is_not_found(harness: Harness) -> None:
    owner = _owner(harness)
    beta = seed_project(harness.db, "beta")
    outsider = _issue(harness, beta)

    with pytest.raises(NotFound):
        harness.db.transaction(
            lambda tx: auth.revoke_token(tx, owner.principal, owner.project, outsider.principal.id)
        )
    assert _authenticate(harness, outsider.token) == outsider.principal.id


def test_a_revoked_token_cannot_be_rotated_back_to_life(harness: Harness) -> None:
    owner = _owner(harness)
    member = _issue(harness, owner.project)
    harness.db.transaction(
        lambda tx: auth.revoke_token(tx, owner.principal, owner.project, member.principal.id)
    )

    with pytest.raises(Conflict):
        harness.db.transaction(
            lambda tx: auth.rotate_token(tx, owner.principal, owner.project, member.principal.id)
        )


def test_last_use_is_recorded_at_most_once_a_minute(harness: Harness) -> None:
    owner = _owner(harness)
    member = _issue(harness, owner.project)
    first = harness.db.transaction(lambda tx: auth.authenticate_use(tx, member.token), write=False)
    assert first.needs_touch
    before = harness.now_ms()
    harness.db.transaction(lambda tx: auth.touch(tx, member.principal.id))
    after = harness.now_ms()

    harness.advance_clock(30_000)
    assert not harness.db.transaction(
        lambda tx: auth.authenticate_use(tx, member.token), write=False
    ).needs_touch
    harness.advance_clock(31_000)
    assert harness.db.transaction(lambda tx: auth.authenticate_use(tx, member.token), write=False).needs_touch

    listed = harness.db.transaction(lambda tx: auth.list_tokens(tx, owner.project), write=False)
    used_at = {r.id: r.last_used_at_ms for r in listed}[member.principal.id]
    assert used_at is not None and before <= used_at <= after


def test_a_revocation_refuses_the_token_another_connection_just_rotated_in(harness: Harness) -> None:
    owner = _owner(harness)
    member = _issue(harness, owner.project)
    other = harness.second_connection()
    try:
        rotated = other.transaction(
            lambda tx: auth.rotate_token(tx, owner.principal, owner.project, member.principal.id)
        )
        harness.db.transaction(
            lambda tx: auth.revoke_token(tx, owner.principal, owner.project, member.principal.id)
        )
    finally:
        other.close()

    for token in (member.token, rotated.token):
        with pytest.raises(Unauthenticated):
            _authenticate(harness, token)
