"""Cron admission keyed by occurrence (docs/cron.md): no edit, disable or enable around a boundary
loses an occurrence, every occurrence that does not become a run is recorded with its reason, the
misfire grace is the task's, and the random delay is seeded by task and occurrence."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import notifications, schedules, tasks
from ql3.application.cron import CronScheduler
from ql3.domain.egress import EgressPolicy
from ql3.domain.tasks import next_fire_ms, random_delay_ms
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness

MINUTE = 60_000
EVERY_MINUTE = "* * * * *"


def _to_next_boundary(harness: Harness, past_ms: int = 30) -> int:
    """Freeze the database clock and move it ``past_ms`` after the next minute boundary."""
    harness.freeze_clock()
    now = harness.now_ms()
    boundary = (now // MINUTE + 1) * MINUTE
    harness.advance_clock(boundary - now + past_ms)
    return boundary


def _runs(harness: Harness) -> list[tuple[int, int, str]]:
    rows = harness.db.raw(
        "SELECT scheduled_for_ms, task_revision, idempotency_key FROM runs ORDER BY scheduled_for_ms"
    )
    return [(int(r["scheduled_for_ms"]), int(r["task_revision"]), str(r["idempotency_key"])) for r in rows]


def _skips(harness: Harness, task_id: str) -> list[tuple[str, int, int, int]]:
    found = harness.db.transaction(lambda tx: schedules.list_skipped(tx, task_id, limit=100), write=False)
    return [(s.reason, s.occurrence_ms, s.last_occurrence_ms, s.occurrences) for s in reversed(found)]


def _cycle(harness: Harness) -> Any:
    return CronScheduler(harness.db).schedule_once()


# -- 1. the edit race ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"command": "echo v2"}, {"cron": "*/2 * * * *"}, {"timeout_ms": 1000}],
    ids=["command", "expression", "timeout"],
)
def test_an_edit_between_the_boundary_and_admission_loses_no_occurrence(
    harness: Harness, change: dict[str, Any]
) -> None:
    # Given a minute task whose occurrence came due 30 ms ago and is not admitted yet
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron=EVERY_MINUTE)
    boundary = _to_next_boundary(harness)

    # When a new revision is written before the scheduler gets to it
    harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "job", change))

    # Then the occurrence ran once, with the revision current when it came due, and never again
    assert _runs(harness) == [(boundary, 1, f"ql3:cron:v2:{task.id}:{boundary}")]
    assert _cycle(harness).admitted == 0
    assert _skips(harness, task.id) == []
    # and the schedule goes on from the new revision
    nxt = harness.db.transaction(lambda tx: schedules.next_fire_at(tx, task.id))
    assert nxt == next_fire_ms(change.get("cron", EVERY_MINUTE), boundary)


def test_disable_and_enable_around_the_boundary(harness: Harness) -> None:
    project = seed_project(harness.db)
    after = seed_task(harness.db, project, name="after", cron=EVERY_MINUTE)
    before = seed_task(harness.db, project, name="before", cron=EVERY_MINUTE)
    harness.freeze_clock()
    # "before" is disabled before the boundary: that suppresses its occurrence
    harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "before", False))
    boundary = _to_next_boundary(harness)

    # "after" is disabled and enabled again just after the boundary: its occurrence still runs
    harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "after", False))
    harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "after", True))
    assert _cycle(harness).admitted == 0
    rows = harness.db.raw("SELECT task_id, scheduled_for_ms FROM runs")
    assert [(r["task_id"], r["scheduled_for_ms"]) for r in rows] == [(after.id, boundary)]

    # "before" stays disabled three boundaries, then comes back: what it missed is on record
    harness.advance_clock(2 * MINUTE)
    harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "before", True))
    assert _skips(harness, before.id) == [("disabled", boundary, boundary + 2 * MINUTE, 3)]
    assert _skips(harness, after.id) == []
    nxt = harness.db.transaction(lambda tx: schedules.next_fire_at(tx, before.id))
    assert nxt == boundary + 3 * MINUTE


def test_an_edit_racing_the_scheduler_on_two_connections_admits_each_occurrence_once(
    harness: Harness,
) -> None:
    project = seed_project(harness.db)
    names = [f"t{i}" for i in range(8)]
    for name in names:
        seed_task(harness.db, project, name=name, cron=EVERY_MINUTE)
    boundary = _to_next_boundary(harness)
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def edit() -> None:
        barrier.wait()
        try:
            for name in names:
                other.transaction(
                    lambda tx, n=name: tasks.edit_task(tx, project.id, n, {"command": "echo v2"})
                )
        except BaseException as exc:  # asserted below
            errors.append(exc)

    editor = threading.Thread(target=edit)
    editor.start()
    barrier.wait()
    _cycle(harness)
    editor.join(60)
    other.close()

    assert not errors
    rows = harness.db.raw("SELECT task_id, scheduled_for_ms FROM runs")
    assert sorted(r["scheduled_for_ms"] for r in rows) == [boundary] * len(names)
    assert len({r["task_id"] for r in rows}) == len(names)
    assert count(harness.db, "cron_skips") == 0


# -- 2. every skip recorded ---------------------------------------------------------------------------


def test_a_delete_after_the_boundary_is_recorded_and_an_unschedule_runs_the_due_one(harness: Harness) -> None:
    project = seed_project(harness.db)
    gone = seed_task(harness.db, project, name="gone", cron=EVERY_MINUTE)
    plain = seed_task(harness.db, project, name="plain", cron=EVERY_MINUTE)
    boundary = _to_next_boundary(harness)

    harness.db.transaction(lambda tx: tasks.delete_task(tx, project.id, "gone"))
    harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "plain", {"cron": None}))

    assert _skips(harness, gone.id) == [("deleted", boundary, boundary, 1)]
    # removing the expression is an edit: what came due before it still runs, under revision 1
    assert _runs(harness) == [(boundary, 1, f"ql3:cron:v2:{plain.id}:{boundary}")]
    assert _skips(harness, plain.id) == []
    assert count(harness.db, "task_schedules") == 0


def test_overlap_skips_are_recorded_and_an_unbroken_streak_is_one_row(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron=EVERY_MINUTE, overlap="skip")
    boundary = _to_next_boundary(harness)
    assert _cycle(harness).admitted == 1  # this run stays queued: the next ones overlap it

    for _ in range(3):
        harness.advance_clock(MINUTE)
        assert _cycle(harness).skipped_overlap == 1

    assert _skips(harness, task.id) == [("overlap", boundary + MINUTE, boundary + 3 * MINUTE, 3)]
    totals = harness.db.transaction(schedules.skipped_totals, write=False)
    assert totals == {"overlap": 3, "misfire": 0, "disabled": 0, "deleted": 0}


def test_an_outage_is_recorded_as_one_misfire_range(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron=EVERY_MINUTE)
    boundary = _to_next_boundary(harness, past_ms=0)
    harness.advance_clock(59 * MINUTE + 30_000)  # an hour's outage: the last minute is 30 s late

    report = _cycle(harness)

    assert report.admitted == 1 and report.skipped_misfire == 59
    assert _skips(harness, task.id) == [("misfire", boundary, boundary + 58 * MINUTE, 59)]
    assert [r[0] for r in _runs(harness)] == [boundary + 59 * MINUTE]


def test_a_long_outage_is_walked_in_bounded_steps_and_fire_once_fires_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedules, "MAX_STEPS", 7)
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron=EVERY_MINUTE, misfire="fire_once")
    boundary = _to_next_boundary(harness, past_ms=0)
    harness.advance_clock(20 * MINUTE + 30_000)  # 21 occurrences, the last one on time

    reports = [_cycle(harness) for _ in range(4)]

    assert [r.more for r in reports] == [True, True, False, False]
    assert sum(r.admitted for r in reports) == 2  # the oldest (catch-up) and the on-time one
    assert [r[0] for r in _runs(harness)] == [boundary, boundary + 20 * MINUTE]
    assert _skips(harness, task.id) == [("misfire", boundary + MINUTE, boundary + 19 * MINUTE, 19)]


def test_the_skipped_records_of_a_task_are_bounded(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedules, "SKIPS_KEPT_PER_TASK", 3)
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron=EVERY_MINUTE, overlap="skip")
    _to_next_boundary(harness)
    _cycle(harness)
    for _ in range(5):  # overlap and disabled records alternate: none merges with the one before
        harness.advance_clock(MINUTE)
        _cycle(harness)
        harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "job", False))
        harness.advance_clock(MINUTE)
        harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "job", True))

    assert [s[0] for s in _skips(harness, task.id)] == ["disabled", "overlap", "disabled"]


# -- 3. the misfire grace -----------------------------------------------------------------------------


@pytest.mark.parametrize(("grace_ms", "late_ms", "admitted"), [(0, 1_000, 0), (600_000, 480_000, 1)])
def test_the_misfire_grace_is_the_tasks(harness: Harness, grace_ms: int, late_ms: int, admitted: int) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron="0 * * * *", misfire_grace_ms=grace_ms)
    harness.freeze_clock()
    due = harness.db.transaction(lambda tx: schedules.next_fire_at(tx, task.id))
    harness.advance_clock(due - harness.now_ms() + late_ms)

    report = _cycle(harness)

    assert report.admitted == admitted and report.skipped_misfire == 1 - admitted
    assert len(_skips(harness, task.id)) == 1 - admitted


def test_an_out_of_range_grace_or_delay_is_refused(harness: Harness) -> None:
    project = seed_project(harness.db)
    bad_specs: list[dict[str, Any]] = [
        {"misfire_grace_ms": -1},
        {"misfire_grace_ms": 3_600_001},
        {"random_delay_ms": 3_600_001},
    ]
    for bad in bad_specs:
        with pytest.raises(Exception, match="must be an integer"):
            seed_task(harness.db, project, cron=EVERY_MINUTE, **bad)
    assert count(harness.db, "tasks") == 0


# -- 5. the random delay ------------------------------------------------------------------------------


def test_the_random_delay_is_seeded_bounded_and_shown_in_the_next_fire(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron=EVERY_MINUTE, random_delay_ms=45_000)
    boundary = _to_next_boundary(harness, past_ms=0)
    delay = random_delay_ms(task.id, boundary, 45_000)
    assert 0 <= delay <= 45_000
    assert harness.db.transaction(lambda tx: schedules.next_fire_at(tx, task.id)) == boundary + delay

    if delay > 0:  # not due before its delay
        harness.advance_clock(delay - 1)
        assert _cycle(harness).admitted == 0
        harness.advance_clock(1)
    else:
        assert _cycle(harness).admitted == 1
    # A restart (a new scheduler) computes the same due time: the run is admitted at it, once.
    assert CronScheduler(harness.db).schedule_once().admitted == (1 if delay > 0 else 0)
    assert [r[0] for r in _runs(harness)] == [boundary]


def test_the_random_delay_spreads_a_busy_minute_and_never_rerolls() -> None:
    delays = [random_delay_ms(f"task-{i}", 1_800_000_000_000, 300_000) for i in range(1000)]
    assert all(0 <= d <= 300_000 for d in delays)
    assert len(set(delays)) > 900  # spread, not bunched
    assert min(delays) < 30_000 and max(delays) > 270_000
    again = [random_delay_ms(f"task-{i}", 1_800_000_000_000, 300_000) for i in range(1000)]
    assert again == delays
    assert random_delay_ms("task-1", 1_800_000_060_000, 300_000) != delays[1]  # per occurrence
    assert random_delay_ms("task-1", 1_800_000_000_000, 0) == 0


# -- 4. one write per page ----------------------------------------------------------------------------


class _CountingDb:
    """The harness database, counting the transactions asked of it."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.writes = 0
        self.reads = 0

    def transaction(self, fn: Any, *, write: bool = True) -> Any:
        if write:
            self.writes += 1
        else:
            self.reads += 1
        return self._db.transaction(fn, write=write)


def test_a_busy_minute_is_admitted_in_one_write_per_page(harness: Harness) -> None:
    project = seed_project(harness.db)
    for i in range(12):
        seed_task(harness.db, project, name=f"t{i:02d}", cron=EVERY_MINUTE)
    boundary = _to_next_boundary(harness)
    counting = _CountingDb(harness.db)

    first = CronScheduler(counting, page=8).schedule_once()  # type: ignore[arg-type]
    second = CronScheduler(counting, page=8).schedule_once()  # type: ignore[arg-type]

    assert (first.admitted, second.admitted) == (8, 4)
    assert (counting.writes, counting.reads) == (2, 0)
    rows = harness.db.raw("SELECT scheduled_for_ms FROM runs")
    assert [r["scheduled_for_ms"] for r in rows] == [boundary] * 12
    cursors = harness.db.raw("SELECT next_occurrence_ms, last_scheduled_at_ms FROM task_schedules")
    assert {(r["next_occurrence_ms"], r["last_scheduled_at_ms"]) for r in cursors} == {
        (boundary + MINUTE, boundary)
    }


class _CountingTx:
    """A transaction that counts the statements run through it."""

    def __init__(self, tx: Any, counter: list[int]) -> None:
        self._tx = tx
        self._counter = counter

    def one(self, query: str, params: Any = None) -> Any:
        self._counter[0] += 1
        return self._tx.one(query, params)

    def all(self, query: str, params: Any = None) -> Any:
        self._counter[0] += 1
        return self._tx.all(query, params)

    def run(self, query: str, params: Any = None) -> Any:
        self._counter[0] += 1
        return self._tx.run(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


class _StatementCountingDb:
    """The harness database, counting the statements of each transaction."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.statements: list[int] = []

    def transaction(self, fn: Any, *, write: bool = True) -> Any:
        counter = [0]
        result = self._db.transaction(lambda tx: fn(_CountingTx(tx, counter)), write=write)
        self.statements.append(counter[0])
        return result


def test_a_page_is_written_in_the_same_few_statements_whatever_its_size(harness: Harness) -> None:
    project = seed_project(harness.db)
    for i in range(24):
        spec: dict[str, Any] = {"overlap": "skip"} if i % 2 else {"max_attempts": 3, "retry_safe": True}
        seed_task(harness.db, project, name=f"t{i:02d}", cron=EVERY_MINUTE, **spec)
    _to_next_boundary(harness)
    counting = _StatementCountingDb(harness.db)

    small = CronScheduler(counting, page=4).schedule_once()  # type: ignore[arg-type]
    large = CronScheduler(counting, page=20).schedule_once()  # type: ignore[arg-type]

    assert (small.admitted, large.admitted) == (4, 20)
    # the page's read, the running check, runs, attempts, events, retry policies, the cursors' move
    assert counting.statements[0] == counting.statements[1] <= 7
    assert count(harness.db, "run_attempts") == 24 and count(harness.db, "run_events") == 48
    assert count(harness.db, "run_retry_policies") == 12


def test_a_run_admitted_with_its_page_is_the_run_create_run_makes(harness: Harness) -> None:
    project = seed_project(harness.db)
    alone = seed_task(harness.db, project, name="alone", cron=EVERY_MINUTE, max_attempts=3, retry_safe=True)
    paged = seed_task(harness.db, project, name="paged", cron=EVERY_MINUTE, max_attempts=3, retry_safe=True)
    boundary = _to_next_boundary(harness)
    spec = harness.db.transaction(lambda tx: tasks.view(tx, alone).spec, write=False)
    # The occurrence of "alone" is admitted one run at a time (create_run); its page meets the key.
    assert harness.db.transaction(lambda tx: schedules.admit(tx, alone, spec, boundary)) == "admitted"

    report = _cycle(harness)

    assert report.decisions == ["admitted", "admitted"] and count(harness.db, "runs") == 2

    def shape(task_id: str) -> dict[str, Any]:
        run = harness.db.raw(f"SELECT * FROM runs WHERE task_id = '{task_id}'")[0]
        attempts = harness.db.raw(f"SELECT * FROM run_attempts WHERE run_id = '{run['id']}'")
        events = harness.db.raw(f"SELECT * FROM run_events WHERE run_id = '{run['id']}' ORDER BY sequence")
        policy = harness.db.raw(f"SELECT * FROM run_retry_policies WHERE run_id = '{run['id']}'")
        ids = {run["id"]: "run", task_id: "task", **{a["id"]: "attempt" for a in attempts}}

        def plain(row: dict[str, Any]) -> dict[str, Any]:
            out = {k: ids.get(v, v) for k, v in row.items() if k not in ("request_digest",)}
            if "idempotency_key" in out:
                out["idempotency_key"] = str(out["idempotency_key"]).replace(task_id, "task")
            return out

        return {
            "run": plain(dict(run)),
            "attempts": [plain(dict(a)) for a in attempts],
            "events": [{**plain(dict(e)), "id": None} for e in events],
            "policy": [plain(dict(p)) for p in policy],
            "digest_set": run["request_digest"] is not None,
        }

    assert shape(paged.id) == shape(alone.id)
    assert [e["type"] for e in shape(paged.id)["events"]] == ["run.created", "run.queued"]
    cursors = harness.db.raw("SELECT next_occurrence_ms FROM task_schedules")
    assert [r["next_occurrence_ms"] for r in cursors] == [boundary + MINUTE] * 2


def test_a_mixed_page_decides_each_task_by_its_policy(harness: Harness) -> None:
    project = seed_project(harness.db)
    plain = seed_task(harness.db, project, name="plain", cron=EVERY_MINUTE)
    busy = seed_task(harness.db, project, name="busy", cron=EVERY_MINUTE, overlap="skip")
    idle = seed_task(harness.db, project, name="idle", cron=EVERY_MINUTE, overlap="skip")
    replace = seed_task(harness.db, project, name="replace", cron=EVERY_MINUTE, overlap="cancel_previous")
    start_run(harness.db, project, busy)
    start_run(harness.db, project, replace)
    boundary = _to_next_boundary(harness)

    report = _cycle(harness)

    assert (report.admitted, report.skipped_overlap) == (3, 1)
    rows = harness.db.raw("SELECT task_id, status, cancel_reason, scheduled_for_ms FROM runs")
    by_task = sorted((r["task_id"], r["status"], r["cancel_reason"], r["scheduled_for_ms"]) for r in rows)
    assert by_task == sorted(
        [
            (plain.id, "queued", None, boundary),
            (busy.id, "queued", None, None),
            (idle.id, "queued", None, boundary),
            (replace.id, "cancelled", "policy", None),
            (replace.id, "queued", None, boundary),
        ]
    )
    assert _skips(harness, busy.id) == [("overlap", boundary, boundary, 1)]
    cursors = harness.db.raw("SELECT next_occurrence_ms FROM task_schedules")
    assert [r["next_occurrence_ms"] for r in cursors] == [boundary + MINUTE] * 4


# -- 5. --on-start ------------------------------------------------------------------------------------


def test_on_start_fires_once_per_start_and_not_again_after_a_crash(harness: Harness) -> None:
    project = seed_project(harness.db)
    boot = seed_task(harness.db, project, name="boot", on_start=True)
    seed_task(harness.db, project, name="plain")
    seed_task(harness.db, project, name="off", on_start=True)
    harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "off", False))
    scheduler = CronScheduler(harness.db)

    def start() -> int:
        return scheduler.fire_on_start(scheduler.begin_start())

    fired = [start()]  # the first start
    fired += [start() for _ in range(3)]  # three crash restarts (no clean stop in between)
    scheduler.clean_stop()
    fired.append(start())  # a start after a clean stop
    fired.append(scheduler.fire_on_start(scheduler.begin_start()))  # and a crash right after it

    assert fired == [1, 0, 0, 0, 1, 0]
    rows = harness.db.raw("SELECT task_id, trigger_type, idempotency_key FROM runs ORDER BY idempotency_key")
    assert [(r["task_id"], r["trigger_type"]) for r in rows] == [(boot.id, "cron")] * 2
    assert [r["idempotency_key"] for r in rows] == [f"ql3:cron:v2:{boot.id}:start:{n}" for n in (1, 2)]


# -- 5. a cron run late for a slot ----------------------------------------------------------------------


def test_a_cron_run_waiting_past_the_lateness_bound_notifies_once(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, name="waits", cron=EVERY_MINUTE)
    seed_task(harness.db, project, name="runs", cron=EVERY_MINUTE)
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret="s" * 32,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="hook", task=None, events=None)
    )
    _to_next_boundary(harness)
    scheduler = CronScheduler(harness.db)
    assert scheduler.schedule_once().admitted == 2
    # "runs" got a slot: it is no longer queued
    harness.db.raw(
        "UPDATE runs SET status = 'dispatching' WHERE task_id = (SELECT id FROM tasks WHERE name = 'runs')"
    )

    early = scheduler.notify_late(120_000, None)
    harness.advance_clock(60_000)
    assert count(harness.db, "notification_outbox") == 0
    harness.advance_clock(61_000)
    late = scheduler.notify_late(120_000, early)
    again = scheduler.notify_late(120_000, late)
    fresh = scheduler.notify_late(120_000, None)  # a new server looks back: the outcome key dedupes

    rows = harness.db.raw("SELECT event, payload_json FROM notification_outbox")
    assert [r["event"] for r in rows] == ["cron_late"]
    assert '"task":"waits"' in rows[0]["payload_json"] and '"waited_ms":121' in rows[0]["payload_json"]
    assert again >= late and fresh >= late
