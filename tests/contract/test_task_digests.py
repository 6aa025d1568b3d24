"""The content digest shown to viewers is keyed: it still changes with every byte of the spec (so it
fences approvals and edits), but nobody without the database's key can recompute it from a guess."""

from __future__ import annotations

from ql3.application import auth, tasks
from ql3.domain.digests import TASK_CONTENT_DOMAIN, canonical_json, keyed_digest
from ql3.domain.tasks import build_spec
from tests.support.builders import seed_project, seed_task
from tests.support.databases import Harness

SPEC = {"command": "./deploy.sh", "env": {"API_SECRET": "hunter2", "OTHER": "x"}}


def test_tasks_differing_only_in_an_env_value_have_different_digests(harness: Harness) -> None:
    project = seed_project(harness.db)
    one = seed_task(harness.db, project, "one", **SPEC)
    two = seed_task(harness.db, project, "two", **{**SPEC, "env": {"API_SECRET": "hunter3", "OTHER": "x"}})
    same = seed_task(harness.db, project, "same", **SPEC)

    digests = [
        harness.db.transaction(lambda tx, t=t: tasks.view(tx, t)).revision.content_digest
        for t in (one, two, same)
    ]

    assert digests[0] != digests[1]
    assert digests[0] == digests[2]  # deterministic within one database


def test_a_guessed_secret_cannot_be_confirmed_without_the_key(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "deploy", **SPEC)
    shown = harness.db.transaction(lambda tx: tasks.view(tx, task)).revision.content_digest

    # The viewer knows everything but the secret, and guesses it right: the old, unkeyed formula and
    # a keyed one with any other key both miss.
    guess = build_spec(SPEC)
    assert guess.digest() != shown
    assert keyed_digest(b"\x00" * 32, TASK_CONTENT_DOMAIN, canonical_json(guess.to_dict())) != shown
    # Only the database's own key reproduces it.
    key = harness.db.transaction(auth.task_digest_key, write=False)
    assert len(key) == 32
    assert keyed_digest(key, TASK_CONTENT_DOMAIN, canonical_json(guess.to_dict())) == shown


def test_an_edit_that_changes_nothing_still_publishes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, "deploy", **SPEC)

    same = harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "deploy", {"env": SPEC["env"]}))
    changed = harness.db.transaction(
        lambda tx: tasks.edit_task(tx, project.id, "deploy", {"env": {"API_SECRET": "other", "OTHER": "x"}})
    )

    assert same.task.revision == 1
    assert changed.task.revision == 2 and changed.revision.content_digest != same.revision.content_digest
