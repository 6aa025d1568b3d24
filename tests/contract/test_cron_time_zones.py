"""Cron in a time zone on both databases (docs/tasks.md "Time zones"): the project's default zone is
written into new schedules, existing ones keep theirs, an edit keeps or moves the zone, and the
scheduler admits a Shanghai morning at midnight UTC (with the shiftable clock)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from ql3.application import project_settings, tasks
from ql3.application.cron import CronScheduler
from ql3.application.schedules import next_fire_at
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import TaskSpec
from tests.support.builders import count, seed_project, seed_task
from tests.support.databases import Harness

SHANGHAI = ZoneInfo("Asia/Shanghai")


def _cron(harness: Harness, name: str) -> str | None:
    project = seed_project(harness.db)
    spec: TaskSpec = harness.db.transaction(
        lambda tx: tasks.view(tx, tasks.find_task(tx, project.id, name)).spec
    )
    return spec.cron


def test_the_project_zone_is_written_into_new_schedules_and_moves_no_existing_one(harness: Harness) -> None:
    # Given a task created while the project had no zone (an upgraded database)
    project = seed_project(harness.db)
    seed_task(harness.db, project, name="old", cron="0 8 * * *")

    # When the project gets a default zone and a new task is created
    harness.db.transaction(lambda tx: project_settings.set_default_zone(tx, project, "Asia/Shanghai"))
    seed_task(harness.db, project, name="new", cron="0 8 * * *")
    seed_task(harness.db, project, name="utc", cron="CRON_TZ=UTC 0 8 * * *")

    # Then the old schedule keeps its UTC meaning, the new one is in the project's zone
    assert _cron(harness, "old") == "0 8 * * *"
    assert _cron(harness, "new") == "CRON_TZ=Asia/Shanghai 0 8 * * *"
    assert _cron(harness, "utc") == "CRON_TZ=UTC 0 8 * * *"
    assert harness.db.transaction(lambda tx: project_settings.default_zone(tx, project)) == "Asia/Shanghai"


def test_an_edit_keeps_the_task_zone_and_tz_moves_it(harness: Harness) -> None:
    project = seed_project(harness.db)
    harness.db.transaction(
        lambda tx: tasks.create_task(
            tx, project.id, "job", {"command": "true", "cron": "0 8 * * *"}, tz="Asia/Tokyo"
        )
    )

    kept = harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "job", {"cron": "0 9 * * *"}))
    moved = harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "job", {}, tz="Europe/Berlin"))

    assert kept.spec.cron == "CRON_TZ=Asia/Tokyo 0 9 * * *"
    assert moved.spec.cron == "CRON_TZ=Europe/Berlin 0 9 * * *"
    assert moved.task.revision == 3


@pytest.mark.parametrize(
    ("cron", "tz", "says"),
    [
        ("0 8 * * *", "Mars/Olympus", "unknown time zone"),
        ("CRON_TZ=Asia/Tokyo 0 8 * * *", "Asia/Shanghai", "disagree"),
        (None, "Asia/Shanghai", "tz needs a cron schedule"),
    ],
)
def test_a_bad_zone_is_refused_and_writes_nothing(
    harness: Harness, cron: str | None, tz: str, says: str
) -> None:
    project = seed_project(harness.db)
    raw = {"command": "true"} | ({"cron": cron} if cron else {})

    with pytest.raises(ValidationFailed) as refused:
        harness.db.transaction(lambda tx: tasks.create_task(tx, project.id, "job", raw, tz=tz))
    with pytest.raises(ValidationFailed):
        harness.db.transaction(lambda tx: project_settings.set_default_zone(tx, project, "Nowhere/Land"))

    assert says in str(refused.value)
    assert count(harness.db, "tasks") == 0 and count(harness.db, "project_settings") == 0


def test_the_scheduler_admits_a_shanghai_morning_at_midnight_utc(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = harness.db.transaction(
        lambda tx: tasks.create_task(
            tx, project.id, "job", {"command": "true", "cron": "0 8 * * *"}, tz="Asia/Shanghai"
        )
    ).task
    fire = harness.db.transaction(lambda tx: next_fire_at(tx, task.id))
    assert fire is not None
    local = datetime.fromtimestamp(fire / 1000, tz=SHANGHAI)
    assert (local.hour, local.minute) == (8, 0)
    assert datetime.fromtimestamp(fire / 1000, tz=UTC).hour == 0

    harness.advance_clock(fire - harness.now_ms() + 1_000)
    report = CronScheduler(harness.db).schedule_once()

    assert report.admitted == 1
    rows = harness.db.raw("SELECT scheduled_for_ms FROM runs")
    assert [r["scheduled_for_ms"] for r in rows] == [fire]
    assert harness.db.transaction(lambda tx: next_fire_at(tx, task.id)) == fire + 24 * 3600 * 1000
