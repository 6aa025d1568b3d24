"""Read models for the API and CLI: paged, project-scoped, low-sensitivity, with effective states."""

from __future__ import annotations

import json

import pytest

from ql3.application import approvals, approved_actions
from ql3.domain.errors import NotFound, ValidationFailed
from tests.support.approval_builders import (
    LEASE_MS,
    approved,
    consume,
    dispatched,
    request,
    started,
    world,
)
from tests.support.builders import seed_project
from tests.support.databases import Harness

SENSITIVE = ("lease_owner", "lease_token_digest", "action_plan", "request_fence", "resolver_token_digest")


def test_approvals_are_listed_newest_first_with_a_keyset_cursor_and_a_state_filter(harness: Harness) -> None:
    w = world(harness.db)
    made = []
    for _ in range(3):
        made.append(request(w).id)
        harness.advance_clock(1_000)
    done = approved(w)

    page, cursor = harness.db.transaction(
        lambda tx: approvals.list_approvals(tx, w.project.id, limit=2), write=False
    )
    rest, end = harness.db.transaction(
        lambda tx: approvals.list_approvals(tx, w.project.id, limit=2, cursor=cursor), write=False
    )
    only, _ = harness.db.transaction(
        lambda tx: approvals.list_approvals(tx, w.project.id, state="approved"), write=False
    )

    assert [a["id"] for a in page + rest] == [done.id, *reversed(made)] and end is None
    assert [a["id"] for a in only] == [done.id]
    with pytest.raises(ValidationFailed):
        harness.db.transaction(lambda tx: approvals.list_approvals(tx, w.project.id, limit=101), write=False)
    with pytest.raises(ValidationFailed):
        harness.db.transaction(
            lambda tx: approvals.list_approvals(tx, w.project.id, state="expired"), write=False
        )


def test_an_approval_view_shows_the_effective_expiry_and_no_plan_or_fence(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w, ttl_ms=60_000)
    harness.advance_clock(60_000)

    view = harness.db.transaction(lambda tx: approvals.get_approval(tx, w.project.id, req.id), write=False)

    assert (view["state"], view["effective_state"]) == ("pending", "expired")
    assert view["action_digest_prefix"] == req.action_digest[:12]
    text = json.dumps(view)
    assert all(key not in view for key in SENSITIVE) and req.action_digest not in text
    assert w.task.id in text  # the action ref is a low-sensitivity id


def test_approvals_and_actions_of_another_project_are_not_found(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    other = seed_project(harness.db, "other")

    with pytest.raises(NotFound):
        harness.db.transaction(
            lambda tx: approvals.get_approval(tx, other.id, dispatch.approval_request_id), write=False
        )
    with pytest.raises(NotFound):
        harness.db.transaction(lambda tx: approved_actions.get_action(tx, other.id, dispatch.id), write=False)
    listed, _ = harness.db.transaction(lambda tx: approved_actions.list_actions(tx, other.id), write=False)
    assert listed == []


def test_actions_show_states_and_recovery_without_owners_or_token_digests(harness: Harness) -> None:
    w = world(harness.db)
    pending = dispatched(w)
    harness.advance_clock(1_000)
    running = dispatched(w)
    fence = started(harness.db, running, owner="replica-secret-owner")
    harness.advance_clock(LEASE_MS)

    page, cursor = harness.db.transaction(
        lambda tx: approved_actions.list_actions(tx, w.project.id, limit=1), write=False
    )
    rest, end = harness.db.transaction(
        lambda tx: approved_actions.list_actions(tx, w.project.id, limit=1, cursor=cursor), write=False
    )

    assert [a["dispatch_id"] for a in page + rest] == [running.id, pending.id] and end is None
    shown = page[0]
    assert (shown["status"], shown["effective_status"], shown["recovery_status"]) == (
        "executing",
        "recovery_required",
        "armed",
    )
    assert (rest[0]["status"], rest[0]["effective_status"]) == ("pending", "pending")
    text = json.dumps(page + rest)
    assert "replica-secret-owner" not in text and fence.token not in text
    assert all(key not in a for a in page + rest for key in SENSITIVE)
    row = harness.db.raw(
        "SELECT lease_token_digest FROM approved_action_executions WHERE dispatch_id = ?", (running.id,)
    )
    assert row[0]["lease_token_digest"] not in text


def test_consumed_approvals_point_at_their_dispatch(harness: Harness) -> None:
    w = world(harness.db)
    req = approved(w)
    dispatch = consume(w, req.id)

    view = harness.db.transaction(lambda tx: approvals.get_approval(tx, w.project.id, req.id), write=False)

    assert (view["state"], view["effective_state"], view["dispatch_id"]) == (
        "consumed",
        "consumed",
        dispatch.id,
    )
