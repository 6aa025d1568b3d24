"""Tokens, notification channels, rules, subscriptions and workers are found by name or by a unique
id prefix (what the CLI accepts where an id is): an exact name wins, several records of one name or
prefix are a conflict listing them, nothing matching is not found. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from ql3.application import auth, lookup, notifications, subscriptions
from ql3.domain.egress import parse_allow
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.lookup import MAX_CANDIDATES, AmbiguousPrefix
from ql3.domain.model import Project
from tests.support.builders import seed_project
from tests.support.databases import Harness
from tests.support.execution_builders import register

LOOPBACK = parse_allow(["127.0.0.0/8"])


def _find(harness: Harness, project: Project, kind: str, ref: str) -> lookup.Named:
    found: lookup.Named = harness.db.transaction(
        lambda tx: lookup.resolve_ref(tx, project.id, kind, ref), write=False
    )
    return found


def _token(harness: Harness, project: Project, name: str) -> str:
    issued: auth.IssuedToken = harness.db.transaction(
        lambda tx: auth.issue_token(tx, name=name, role="viewer", project=project)
    )
    return str(issued.principal.id)


def _channel(harness: Harness, project: Project, name: str) -> str:
    view = harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx, project, name=name, kind="apprise", url="json://127.0.0.1:9/x", secret=None, egress=LOOPBACK
        )
    )
    return str(view.id)


def _common(ids: list[str]) -> str:
    shared = ids[0]
    for other in ids[1:]:
        while not other.startswith(shared):
            shared = shared[:-1]
    return shared


def test_a_token_is_found_by_its_name_or_a_unique_id_prefix(harness: Harness) -> None:
    project = seed_project(harness.db)
    ci = _token(harness, project, "ci-bot")
    other = _token(harness, project, "backup")

    assert _find(harness, project, "token", "ci-bot").id == ci
    everyone = [str(r["id"]) for r in harness.db.raw("SELECT id FROM principals")]

    def unique(mine: str) -> str:  # ids made at once share their start
        return mine[: max(len(_common([mine, o])) for o in everyone if o != mine) + 1]

    assert _find(harness, project, "token", unique(ci)).id == ci
    assert _find(harness, project, "token", unique(other).upper()).id == other
    assert _find(harness, project, "token", ci) == lookup.Named(id=ci, name="ci-bot")


def test_a_shared_token_name_is_ambiguous_listing_the_ids(harness: Harness) -> None:
    project = seed_project(harness.db)
    made = [_token(harness, project, "token") for _ in range(MAX_CANDIDATES + 1)]

    with pytest.raises(AmbiguousPrefix) as caught:
        _find(harness, project, "token", "token")

    assert caught.value.http_status == 409 and caught.value.code == "ambiguous_id"
    assert len(caught.value.details["candidates"]) == MAX_CANDIDATES
    assert set(caught.value.details["candidates"]) <= set(made)
    assert caught.value.details["more"] is True


def test_an_ambiguous_id_prefix_lists_the_candidates(harness: Harness) -> None:
    project = seed_project(harness.db)
    made = [_token(harness, project, f"t{i}") for i in range(2)]
    shared = _common(made)

    with pytest.raises(AmbiguousPrefix) as caught:
        _find(harness, project, "token", shared)

    assert set(made) <= set(caught.value.details["candidates"])  # ids made at once share their start


def test_a_token_of_another_project_is_not_found_by_name_or_prefix(harness: Harness) -> None:
    project = seed_project(harness.db)
    other = seed_project(harness.db, "other")
    theirs = _token(harness, other, "theirs")

    for ref in ("theirs", theirs):
        with pytest.raises(NotFound):
            _find(harness, project, "token", ref)


def test_a_channel_is_found_by_name_or_id_prefix_and_a_rule_by_id_prefix(harness: Harness) -> None:
    project = seed_project(harness.db)
    ops = _channel(harness, project, "ops")
    _channel(harness, project, "pager")
    rule = harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="ops", task=None, events=None)
    )

    assert _find(harness, project, "channel", "ops") == lookup.Named(id=ops, name="ops")
    assert _find(harness, project, "channel", ops[:20]).name == "ops"
    assert _find(harness, project, "rule", str(rule.id)[:20]).id == rule.id
    with pytest.raises(NotFound):
        _find(harness, project, "channel", "nobody")
    with pytest.raises(ValidationFailed):  # rules have no names: "ops" is only a too-short prefix
        _find(harness, project, "rule", "ops")


def test_a_subscription_is_found_by_name_or_id_prefix(harness: Harness) -> None:
    project = seed_project(harness.db)
    new = subscriptions.NewSubscription(name="scripts", repo_url="file:///srv/repo.git")
    sub = harness.db.transaction(lambda tx: subscriptions.add(tx, project.id, new))

    assert _find(harness, project, "subscription", "scripts") == lookup.Named(id=sub.id, name="scripts")
    assert _find(harness, project, "subscription", sub.id[:16]).name == "scripts"
    with pytest.raises(NotFound):
        _find(harness, seed_project(harness.db, "other"), "subscription", "scripts")


def test_a_worker_is_found_by_its_whole_id_even_short_or_by_a_prefix_keeping_case(harness: Harness) -> None:
    project = seed_project(harness.db)
    register(harness.db, "w1")
    register(harness.db, "Build-Box-01")
    register(harness.db, "Build-Box-02")

    assert _find(harness, project, "worker", "w1").id == "w1"  # shorter than a prefix may be
    assert _find(harness, project, "worker", "Build-Box-01").id == "Build-Box-01"
    with pytest.raises(AmbiguousPrefix) as caught:
        _find(harness, project, "worker", "Build-Box-0")
    assert caught.value.details["candidates"] == ["Build-Box-01", "Build-Box-02"]
    with pytest.raises(NotFound):
        _find(harness, project, "worker", "build-box-0")  # worker ids keep their case


def test_a_short_or_malformed_reference_that_names_nothing_is_invalid(harness: Harness) -> None:
    project = seed_project(harness.db)
    for bad in ("abc", "ab c%", "x_y_z"):
        with pytest.raises(ValidationFailed):
            _find(harness, project, "token", bad)
    with pytest.raises(NotFound):
        _find(harness, project, "token", "x" * 129)
