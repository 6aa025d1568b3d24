"""Worker credentials and the project list on both databases: one live credential per worker id,
revocation refuses at once, and a principal sees only the projects it holds a role in."""

from __future__ import annotations

import pytest

from ql3.application import auth, worker_credentials
from ql3.domain.errors import NotFound, Unauthenticated
from ql3.domain.model import Project
from tests.support.builders import count, seed_project
from tests.support.databases import Harness


def test_a_worker_id_has_one_live_credential_until_it_is_revoked(harness: Harness) -> None:
    # Given a credential for worker w1
    issued = harness.db.transaction(lambda tx: worker_credentials.issue(tx, "w1", expires_in_s=3600))
    principal = harness.db.transaction(lambda tx: auth.authenticate(tx, issued.token), write=False)
    assert worker_credentials.worker_id_of(principal) == "w1" and principal.kind == "worker"
    assert issued.record.worker_id == "w1" and issued.record.revoked_at_ms is None
    assert issued.record.expires_at_ms == issued.record.created_at_ms + 3_600_000

    # Then a second one is refused and writes nothing
    before = count(harness.db, "principals")
    with pytest.raises(worker_credentials.WorkerTokenExists):
        harness.db.transaction(lambda tx: worker_credentials.issue(tx, "w1"))
    assert count(harness.db, "principals") == before

    # When it is revoked, it is refused from the next request on and a new one may be issued
    revoked = harness.db.transaction(lambda tx: worker_credentials.revoke(tx, issued.record.id))
    assert revoked.revoked_at_ms is not None and revoked.id == issued.record.id
    with pytest.raises(Unauthenticated):
        harness.db.transaction(lambda tx: auth.authenticate(tx, issued.token), write=False)
    again = harness.db.transaction(lambda tx: worker_credentials.revoke(tx, issued.record.id))
    assert again == revoked
    fresh = harness.db.transaction(lambda tx: worker_credentials.issue(tx, "w1"))
    assert fresh.record.expires_at_ms is None

    listed = harness.db.transaction(lambda tx: worker_credentials.list_page(tx), write=False)
    assert {(t.id, t.revoked_at_ms is None) for t in listed} == {
        (issued.record.id, False),
        (fresh.record.id, True),
    }


def test_revoking_an_unknown_or_non_worker_credential_is_not_found(harness: Harness) -> None:
    owner = harness.db.transaction(auth.bootstrap_owner)
    assert owner is not None

    for token_id in ("nope", owner.principal.id):
        with pytest.raises(NotFound):
            harness.db.transaction(lambda tx, token_id=token_id: worker_credentials.revoke(tx, token_id))
    assert harness.db.transaction(lambda tx: auth.authenticate(tx, owner.token), write=False).is_owner


def _visible(
    harness: Harness, token: auth.IssuedToken, after: str, limit: int
) -> tuple[list[str], str | None]:
    page, cursor = harness.db.transaction(
        lambda tx: auth.visible_projects(tx, token.principal, after=after, limit=limit), write=False
    )
    return [f"{project.name}:{role}" for project, role in page], cursor


def test_the_project_list_shows_only_projects_with_a_role_and_pages_by_what_it_scanned(
    harness: Harness,
) -> None:
    # Given the owner, projects a, b, c, and a viewer of b only
    owner = harness.db.transaction(auth.bootstrap_owner)
    assert owner is not None
    projects: dict[str, Project] = {name: seed_project(harness.db, name) for name in ("a", "b", "c")}
    viewer = harness.db.transaction(
        lambda tx: auth.issue_token(tx, name="v", role="viewer", project=projects["b"])
    )

    # Then the owner sees every project as admin, the viewer only b
    assert _visible(harness, owner, "", 10) == (["a:admin", "b:admin", "c:admin", "default:admin"], None)
    assert _visible(harness, viewer, "", 10) == (["b:viewer"], None)
    # and a full page that shows nothing still hands on the cursor of what it scanned
    assert _visible(harness, viewer, "", 1) == ([], "a")
    assert _visible(harness, viewer, "a", 1) == (["b:viewer"], "b")
    assert _visible(harness, viewer, "c", 1) == ([], "default")
