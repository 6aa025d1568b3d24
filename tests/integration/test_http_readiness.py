"""/readyz and /metrics report each control loop's age since its last successful cycle; a stuck loop
makes the server unready and is named."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ql3.application.lifecycle import LifecycleRunner
from ql3.http.app import create_app
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.waits import wait_for


class _Runtime:
    def __init__(self, loops: list[LifecycleRunner]) -> None:
        self.loops = loops

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()


@pytest.fixture
def blocked() -> Iterator[threading.Event]:
    release = threading.Event()
    yield release
    release.set()


def test_a_stuck_loop_makes_readyz_503_and_names_it(db: SqliteDatabase, blocked: threading.Event) -> None:
    # Given a healthy loop and one whose cycle hangs (say, on a database that stopped answering)
    idle = threading.Event()
    healthy = LifecycleRunner("dispatcher", lambda: False, wake=lambda t: idle.wait(t), backstop_s=0.05)
    entered = threading.Event()

    def hang() -> bool:
        entered.set()
        blocked.wait(30)
        return False

    stuck = LifecycleRunner("cron", hang, wake=lambda t: False, backstop_s=0.05, stuck_after_s=0.3)

    with TestClient(create_app(db, lifecycle=[_Runtime([healthy, stuck])])) as client:
        entered.wait(5)
        first = client.get("/readyz")
        assert first.status_code == 200
        assert set(first.json()["loops"]) == {"dispatcher", "cron"}

        # When the hanging cycle outlives the loop's bound
        wait_for(lambda: client.get("/readyz").status_code == 503)

        # Then readyz names only that loop, and /metrics shows its age and the stuck flag
        error = client.get("/readyz").json()["error"]
        assert error["code"] == "loops_stuck" and error["details"]["loops"] == ["cron"]
        metrics = client.get("/metrics").text
        assert 'ql3_loop_stuck{loop="cron"} 1.0' in metrics
        assert 'ql3_loop_stuck{loop="dispatcher"} 0.0' in metrics
        age = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith('ql3_loop_last_success_age_seconds{loop="cron"}')
        )
        assert age > 0.3

        # And once the cycle ends, the server is ready again
        blocked.set()
        wait_for(lambda: client.get("/readyz").status_code == 200)
