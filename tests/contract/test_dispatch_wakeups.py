"""Who wakes the dispatcher, on SQLite and PostgreSQL (issue 11: one wake-up per run, not three):
a new run notifies ``runs`` once, after its commit; the end of its lease notifies ``slots`` (a freed
slot), not ``runs``; and an idle ``ql3 serve`` runs one run from creation to its end with one ``runs``
notification in all (application/embedded_dispatch.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ql3.application import lease_results, runs
from ql3.application.settings import load_serve_settings
from ql3.bootstrap import build_standalone_runtime
from ql3.cluster.pull import PullService
from ql3.ports import channels
from tests.support.builders import seed_project, seed_task, start_run
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, register, request, start
from tests.support.waits import wait_for


class _Spy:
    """The notifications the database adapter posts to its process's notifier, in order."""

    def __init__(self, harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        notifier = harness.db.notifier
        self.posted: list[str] = []
        real = notifier.notify

        def notify(channel: str) -> None:
            self.posted.append(channel)
            real(channel)

        monkeypatch.setattr(notifier, "notify", notify)


def test_a_new_run_notifies_runs_once_after_its_commit(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    spy = _Spy(harness, monkeypatch)
    inside: list[list[str]] = []

    def create(tx: Any) -> None:
        runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))
        inside.append(list(spy.posted))

    harness.db.transaction(create)

    assert inside == [[]]  # nothing before the commit
    assert spy.posted == [channels.RUNS]


def test_the_end_of_a_lease_notifies_the_freed_slot_not_the_queue(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(harness.db, lease_ms=600_000)
    queued(harness.db)
    offer = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None
    fence = start(harness.db, offer, token="cb-token")
    spy = _Spy(harness, monkeypatch)

    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )

    assert spy.posted == [channels.SLOTS]


def test_a_waiting_pull_of_a_full_worker_is_woken_by_the_freed_slot(harness: Harness) -> None:
    # Given a one-slot worker holding a started run, and a second run queued
    queued(harness.db, 2)
    session = register(harness.db, "w1", slots=1, lease_ms=600_000)
    notifier = harness.db.notifier
    waited: list[set[str]] = []

    def wait_past(marks: dict[str, int], timeout_s: float) -> bool:
        waited.append(set(marks))
        return bool(notifier.wait_past(marks, timeout_s))

    service = PullService(harness.db, wait_past=wait_past)
    first = service.pull_once(request(session))
    assert first.reason == "claimed" and first.offer is not None
    fence = start(harness.db, first.offer, token="cb-token")
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(service.pull(request(session), wait_ms=20_000)))
    thread.start()
    wait_for(lambda: waited, 30, what="the pull waits (no capacity)")

    # When the first run completes
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )
    thread.join(60)

    # Then the long-poll was waiting on the freed slot too, and claimed the second run
    assert waited[0] == {channels.RUNS, channels.SLOTS}
    assert found and found[0].reason == "claimed"


def test_an_idle_server_is_woken_once_per_run(harness: Harness, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "lease.secret").write_bytes(SECRET)
    settings = load_serve_settings(
        {"QL3_HOME": str(home)}, profile="standalone", slots=4, worker_id="w1", database_url=None, cpus=2
    )
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, command="true")
    runtime = build_standalone_runtime(harness.db, settings)
    notifier = harness.db.notifier
    runtime.start()
    try:
        before = notifier.counters((channels.RUNS, channels.SLOTS))

        # When one run is created and executed to its end, and its slot is free again
        run, _ = start_run(harness.db, project, task)

        def settled() -> bool:
            (row,) = harness.db.raw("SELECT status FROM runs WHERE id = ?", (run.id,))
            return bool(row["status"] == "succeeded" and runtime.worker.active_count == 0)

        wait_for(settled, 60, what="the run succeeded and left the worker's active set")

        # Then its creation was the only "runs" notification (its lease's end notified "slots", and
        # the worker's freed slot nobody, the dispatcher having found the queue empty)
        after = notifier.counters((channels.RUNS, channels.SLOTS))
        assert after[channels.RUNS] - before[channels.RUNS] == 1
        assert after[channels.SLOTS] - before[channels.SLOTS] == 1
    finally:
        runtime.stop()
