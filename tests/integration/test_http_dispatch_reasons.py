"""What the dispatcher saw reaches a user: the run resource's ``dispatch_reasons``, ``ql3 run show``'s
``dispatcher saw`` lines and ``/metrics``' ``ql3_dispatch_reasons_total`` (docs/dispatch.md), fed by
the real dispatch loop of ``ql3 serve`` over a real dispatcher."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application.dispatch_reasons import DispatchReasons
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.application.embedded_dispatch import EmbeddedDispatch
from ql3.cli import runs as cli_runs
from ql3.domain.offers import Offer
from ql3.http.app import create_app
from ql3.storage.notify import LocalNotifier
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.execution_builders import register

RUNS = "/api/v1/projects/default/runs"


def test_a_run_no_worker_matches_shows_what_the_dispatcher_saw(
    db: SqliteDatabase, owner: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    board = DispatchReasons()
    offered: list[Offer] = []

    class Runtime:
        loops: list[Any] = []
        dispatch_reasons = board

        def start(self) -> None: ...

        def stop(self) -> None: ...

    def submit(offer: Offer, *, asked_at: float | None = None) -> None:
        offered.append(offer)

    loop = EmbeddedDispatch(
        RunDispatcher(
            db, lease_secret=b"k" * 32, budget=DispatchBudget(), incarnation_started_ms=0
        ).dispatch_once,
        active_count=lambda: 0,
        slots=4,
        submit=submit,
        wakeups=LocalNotifier(),
        fault=lambda _point: None,
        reasons=board,
    )
    with TestClient(create_app(db, lifecycle=[Runtime()])) as client:
        # Given a plain worker and a run that needs gpu=yes, seen by three dispatch cycles
        register(db, "plain")
        made = client.post(
            "/api/v1/projects/default/tasks",
            json={"name": "needs-gpu", "command": "true", "require": {"gpu": "yes"}},
            headers=owner,
        )
        assert made.status_code == 201, made.text
        run = client.post("/api/v1/projects/default/tasks/needs-gpu/runs", json={}, headers=owner).json()
        for _ in range(3):
            loop.cycle()

        shown = client.get(f"{RUNS}/{run['id']}", headers=owner).json()
        listed = client.get(RUNS, headers=owner).json()["items"]
        body = client.get("/metrics").text

    # Then the run's resource says it once, with when it was last seen and how often
    assert offered == []
    [seen] = shown["dispatch_reasons"]
    assert (seen["reason"], seen["scope"], seen["count"]) == ("no_match", "run", 3)
    assert run["created_at_ms"] <= seen["first_seen_at_ms"] <= seen["last_seen_at_ms"]
    assert [r["dispatch_reasons"] for r in listed] == [None]  # the run's own resource only
    # And /metrics counts every sighting by reason, with no id
    assert 'ql3_dispatch_reasons_total{reason="no_match"} 3.0' in body
    assert 'ql3_dispatch_reasons_total{reason="plans_unavailable"} 0.0' in body
    assert run["id"] not in body
    # And `ql3 run show` prints it
    cli_runs._show(shown, "needs-gpu", True)
    out = capsys.readouterr().out
    assert "dispatcher saw  no match: no worker offers the run's executor type and required labels" in out
    assert "3 times)" in out


def test_a_server_without_a_dispatcher_shows_no_reasons(
    client: TestClient, owner: dict[str, str], make_task: Any
) -> None:
    make_task("plain")
    run = client.post("/api/v1/projects/default/tasks/plain/runs", json={}, headers=owner).json()

    shown = client.get(f"{RUNS}/{run['id']}", headers=owner).json()

    assert shown["dispatch_reasons"] is None
    assert "ql3_dispatch_reasons_total" not in client.get("/metrics").text
