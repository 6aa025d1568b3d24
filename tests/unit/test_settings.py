"""``ql3 serve``'s settings: one frozen object from flags and environment, and profiles whose budgets
really differ (edge does less per cycle and sleeps longer when idle)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ql3.application.control_loops import SUBSCRIPTIONS_BACKSTOP_S
from ql3.application.settings import PROFILES, ServeSettings, SettingsError, load_serve_settings
from ql3.bootstrap import build_standalone_runtime
from ql3.storage.sqlite.adapter import SqliteDatabase


def _load(env: dict[str, str], **flags: Any) -> ServeSettings:
    options: dict[str, Any] = {
        "profile": "standalone",
        "slots": None,
        "worker_id": None,
        "database_url": None,
        "cpus": 4,
    }
    options.update(flags)
    return load_serve_settings(env, **options)


def test_settings_come_from_the_flags_and_the_environment_and_are_frozen(tmp_path: Path) -> None:
    env = {"QL3_HOME": str(tmp_path), "QL3_RUN_LEASE_MS": "45000", "QL3_CANCEL_LEASE_MS": " 20000 "}

    settings = load_serve_settings(env, profile="edge", slots=3, worker_id="w1", database_url=None, cpus=8)

    assert (settings.profile, settings.slots, settings.worker_id) == ("edge", 3, "w1")
    assert (settings.run_lease_ms, settings.cancel_lease_ms, settings.action_lease_ms) == (
        45000,
        20000,
        60000,
    )
    assert settings.database_url == f"sqlite:///{tmp_path / 'ql3.db'}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.slots = 9  # type: ignore[misc]


def test_a_flag_wins_over_the_environment_and_a_relative_home_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = _load({"QL3_HOME": "rel", "QL3_DATABASE_URL": "sqlite:///from/env.db"})
    assert settings.home == tmp_path / "rel"
    assert settings.database_url == "sqlite:///from/env.db"

    flagged = _load({"QL3_DATABASE_URL": "sqlite:///from/env.db"}, database_url="postgresql://h/db")
    assert flagged.database_url == "postgresql://h/db"


def test_default_slots_follow_the_profile() -> None:
    assert _load({}, cpus=8).slots == 16
    assert _load({}, cpus=64).slots == 64
    assert _load({}, profile="edge", cpus=8).slots == 4
    assert _load({}, profile="edge", cpus=1).slots == 2


def test_an_error_names_the_variable_but_never_echoes_its_value() -> None:
    with pytest.raises(SettingsError) as caught:
        _load({"QL3_DATABASE_URL": "mysql://app:s3cret@db/x"})

    assert caught.value.variable == "QL3_DATABASE_URL"
    assert "s3cret" not in caught.value.message


def test_edge_budgets_are_smaller_than_standalone() -> None:
    edge, standalone = PROFILES["edge"], PROFILES["standalone"]
    for name in (
        "dispatch_page",
        "dispatch_claims",
        "cancel_page",
        "cancel_pages",
        "timeout_page",
        "expiry_page",
        "cron_page",
        "approvals_page",
        "max_slots",
        "default_slots_cap",
        "http_backlog",
    ):
        assert getattr(edge, name) < getattr(standalone, name), name
    for name in (
        "dispatch_backstop_s",
        "expiry_backstop_s",
        "cancellation_backstop_s",
        "cron_backstop_s",
        "actions_backstop_s",
    ):
        assert getattr(edge, name) > getattr(standalone, name), name


@pytest.mark.parametrize("profile", ["edge", "standalone"])
def test_the_runtime_is_built_with_the_profile_s_budgets(tmp_path: Path, profile: str) -> None:
    # Given settings for the profile and a run lease from the environment
    settings = load_serve_settings(
        {"QL3_HOME": str(tmp_path), "QL3_RUN_LEASE_MS": "40000"},
        profile=profile,
        slots=None,
        worker_id="w",
        database_url=None,
        cpus=2,
    )
    db = SqliteDatabase(tmp_path / "ql3.db")
    try:
        db.migrate()

        # When the runtime is wired (not started)
        runtime = build_standalone_runtime(db, settings)

        # Then its dispatcher, worker and loops use exactly those budgets
        budgets = settings.budgets
        assert runtime.dispatcher.budget.candidate_page == budgets.dispatch_page
        assert runtime.dispatcher.budget.claims == budgets.dispatch_claims
        assert runtime.dispatcher.budget.lease_ms == 40000
        assert (runtime.worker.config.slots, runtime.worker.config.run_lease_ms) == (settings.slots, 40000)
        backstops = {loop.name: loop.backstop_s for loop in runtime.loops}
        assert backstops == {
            "dispatcher": budgets.dispatch_backstop_s,
            "worker-maintain": budgets.maintain_backstop_s,
            "lease-expiry": budgets.expiry_backstop_s,
            "cancellation": budgets.cancellation_backstop_s,
            "approved-actions": budgets.actions_backstop_s,
            "cron": budgets.cron_backstop_s,
            "notifications": budgets.notify_backstop_s,
            "retention": budgets.retention_backstop_s,
            "subscriptions": SUBSCRIPTIONS_BACKSTOP_S,  # a constant: scheduled syncs are minutes apart
        }
    finally:
        db.close()
