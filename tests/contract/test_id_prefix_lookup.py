"""Short ids: a unique prefix finds the one record of its kind in its project; several matches are a
conflict that lists candidates; principals are named for people reading approvals."""

from __future__ import annotations

import pytest

from ql3.application import lookup
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.lookup import MAX_CANDIDATES, AmbiguousPrefix
from tests.support.approval_builders import dispatched, request, user, world
from tests.support.builders import seed_project, seed_task, start_run
from tests.support.databases import Harness


def _common_prefix(ids: list[str]) -> str:
    shared = ids[0]
    for other in ids[1:]:
        while not other.startswith(shared):
            shared = shared[:-1]
    return shared


def _resolve(harness: Harness, project_id: str, kind: str, prefix: str) -> str:
    found: str = harness.db.transaction(
        lambda tx: lookup.resolve_prefix(tx, project_id, kind, prefix), write=False
    )
    return found


def test_a_unique_prefix_resolves_to_the_run(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    first, _ = start_run(harness.db, project, task)
    second, _ = start_run(harness.db, project, task)
    shared = _common_prefix([first.id, second.id])

    # One more character than the shared part tells the two apart.
    assert _resolve(harness, project.id, "run", first.id[: len(shared) + 1]) == first.id
    assert _resolve(harness, project.id, "run", second.id[: len(shared) + 1].upper()) == second.id
    assert _resolve(harness, project.id, "run", first.id) == first.id


def test_an_ambiguous_prefix_is_a_conflict_listing_candidates(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    made = [start_run(harness.db, project, task)[0].id for _ in range(MAX_CANDIDATES + 2)]
    shared = _common_prefix(made)
    assert len(shared) >= 4

    with pytest.raises(AmbiguousPrefix) as caught:
        _resolve(harness, project.id, "run", shared)

    assert caught.value.code == "ambiguous_id" and caught.value.http_status == 409
    candidates = caught.value.details["candidates"]
    assert len(candidates) == MAX_CANDIDATES and set(candidates) <= set(made)
    assert caught.value.details["more"] is True


def test_a_prefix_matching_nothing_or_another_project_is_not_found(harness: Harness) -> None:
    project = seed_project(harness.db)
    other = seed_project(harness.db, "other")
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))

    with pytest.raises(NotFound):
        _resolve(harness, project.id, "run", "ffff")
    with pytest.raises(NotFound):
        _resolve(harness, other.id, "run", run.id[:20])
    # a run id is not a task id
    with pytest.raises(NotFound):
        _resolve(harness, project.id, "task", run.id[:20])


def test_a_short_or_malformed_prefix_is_invalid(harness: Harness) -> None:
    project = seed_project(harness.db)
    for bad in ("01a", "01a2%", "01a2_", "", "x" * 129):
        with pytest.raises(ValidationFailed):
            _resolve(harness, project.id, "run", bad)


def test_tasks_approvals_and_actions_resolve_by_prefix(harness: Harness) -> None:
    w = world(harness.db)
    pending = request(w)
    action = dispatched(w)

    assert _resolve(harness, w.project.id, "task", w.task.id[:30]) == w.task.id
    assert _resolve(harness, w.project.id, "approval", pending.id[:30]) == pending.id
    assert _resolve(harness, w.project.id, "action", action.id[:30]) == action.id


def test_principal_names_are_shown_only_within_the_project(harness: Harness) -> None:
    project = seed_project(harness.db)
    other = seed_project(harness.db, "other")
    alice = user(harness.db, project, "approver", "alice")
    bob = user(harness.db, other, "viewer", "bob")

    named = harness.db.transaction(lambda tx: lookup.principal_name(tx, project.id, alice.id), write=False)

    assert (named.id, named.name, named.kind) == (alice.id, "alice", "user")
    with pytest.raises(NotFound):
        harness.db.transaction(lambda tx: lookup.principal_name(tx, project.id, bob.id), write=False)
