"""A worker's ACK lost to a dropped database connection (``StorageUnavailable``) must not strand its
run: a lost starting ACK leaves the lease to expire (nothing was spawned, nothing is renewed), and a
lost running ACK is sent again by maintenance, so the exited process is completed exactly once.

Found by the PostgreSQL connection-loss test: a running ACK that failed on a terminated backend left
the worker retrying a completion the control plane refused forever (it never held the callback
digest), and the maintenance loop reported itself stuck."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.application import auth, leases, runs, tasks
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.application.gateway import InProcessControlPlane
from ql3.domain.errors import StorageUnavailable
from ql3.domain.offers import LeaseFence, Offer
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.agent import WorkerAgent
from ql3.worker.config import WorkerConfig


class DroppingPlane(InProcessControlPlane):
    """Fails the first call of one ACK with ``StorageUnavailable``: before the transaction ran, or
    after it committed (the answer lost with the connection)."""

    def __init__(self, db: SqliteDatabase, *, fail: str, after_commit: bool) -> None:
        super().__init__(db)
        self.fail = fail
        self.after_commit = after_commit
        self.calls: dict[str, int] = {}

    def _maybe_drop(self, name: str, call: Any) -> Any:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name != self.fail or self.calls[name] > 1:
            return call()
        if self.after_commit:
            call()
        raise StorageUnavailable("the connection was terminated")

    def ack_starting(self, fence: LeaseFence) -> Any:
        return self._maybe_drop("ack_starting", lambda: super(DroppingPlane, self).ack_starting(fence))

    def ack_running(self, fence: LeaseFence, **kwargs: Any) -> Any:
        return self._maybe_drop(
            "ack_running", lambda: super(DroppingPlane, self).ack_running(fence, **kwargs)
        )


class HeldCompletion(InProcessControlPlane):
    """Holds the first completion until the test releases it (a settlement caught mid-way)."""

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.completions = 0

    def complete(self, fence: LeaseFence, **kwargs: Any) -> Any:
        self.completions += 1
        if self.completions == 1:
            self.entered.set()
            self.release.wait(15)
        return super().complete(fence, **kwargs)


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.db = SqliteDatabase(tmp_path / "ql3.db")
        self.db.migrate()
        owner = self.db.transaction(auth.bootstrap_owner)
        assert owner is not None
        self.project = owner.project
        self.marker = tmp_path / "starts"
        self.task = self.db.transaction(
            lambda tx: tasks.create_task(
                tx, self.project.id, "t", {"command": f"echo x >> {self.marker}; sleep 0.2"}
            )
        ).task
        self.home = tmp_path

    def agent(self, plane: InProcessControlPlane) -> WorkerAgent:
        return WorkerAgent(
            plane,
            WorkerConfig(worker_id="w1", home=self.home / "worker", slots=4),
            clock=lambda: time.time_ns() // 1_000_000,
        )

    def claim(self) -> Offer:
        self.db.transaction(
            lambda tx: runs.create_run(tx, runs.CreateRun(project_id=self.project.id, task=self.task))
        )
        d = RunDispatcher(self.db, lease_secret=b"k" * 32, budget=DispatchBudget(), incarnation_started_ms=0)
        offer = d.dispatch_once().offer
        assert offer is not None
        return offer

    def run_status(self, run_id: str) -> str:
        return str(self.db.transaction(lambda tx: runs.get_run(tx, self.project.id, run_id)).status)

    def starts(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.db.close()


def _maintain_until(agent: WorkerAgent, predicate: Any, timeout_s: float = 15) -> None:
    """Maintenance passes as the loop runs them; a pass that raises fails the test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.maintain()
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("after_commit", [False, True], ids=["before-commit", "answer-lost"])
def test_a_running_ack_lost_to_the_database_is_sent_again_and_the_run_completes_once(
    env: Env, after_commit: bool
) -> None:
    plane = DroppingPlane(env.db, fail="ack_running", after_commit=after_commit)
    agent = env.agent(plane)
    agent.start()
    try:
        offer = env.claim()

        # When the running ACK fails on a dropped connection
        state = agent.receive(offer)

        # Then the process runs on, the ACK is sent again by maintenance, and the run succeeds once
        assert state == "started"
        _maintain_until(agent, lambda: env.run_status(offer.fence.run_id) == "succeeded")
        assert plane.calls["ack_running"] == 2
        assert env.starts() == 1
        _maintain_until(agent, lambda: agent.active_count == 0)
        lease = env.db.transaction(lambda tx: leases.get_lease(tx, offer.fence.attempt_id))
        assert lease is not None and lease.status == "completed"
    finally:
        agent.stop()


def test_a_starting_ack_lost_to_the_database_spawns_nothing_and_renews_nothing(env: Env) -> None:
    plane = DroppingPlane(env.db, fail="ack_starting", after_commit=False)
    agent = env.agent(plane)
    agent.start()
    try:
        offer = env.claim()

        with pytest.raises(StorageUnavailable):
            agent.receive(offer)

        # Then nothing was spawned and the worker holds nothing: the lease is left to expire (and the
        # run to be placed again) instead of being renewed forever for a process that never starts
        assert agent.active_count == 0
        agent.maintain()
        time.sleep(0.3)
        assert env.starts() == 0
        assert env.run_status(offer.fence.run_id) != "running"
    finally:
        agent.stop()


def test_a_second_settlement_while_one_is_under_way_leaves_it_to_the_first(env: Env) -> None:
    """The exit watcher and maintenance can both find an exited process. A second settlement beside
    the first would find the receipt consumed and take the attempt for one that exited without a
    receipt (sweeping its group, reporting it lost); it must leave the work to the first."""
    plane = HeldCompletion(env.db)
    agent = env.agent(plane)
    agent.start()
    try:
        offer = env.claim()
        assert agent.receive(offer) == "started"
        # Given the exit watcher's settlement of the exited process, held inside its completion
        assert plane.entered.wait(15)

        # When maintenance (or anyone) settles the same attempt meanwhile
        second = agent.settle(offer.fence.attempt_id)

        # Then it leaves it to the first, which completes the run once
        assert second == "settling"
        plane.release.set()
        _maintain_until(agent, lambda: env.run_status(offer.fence.run_id) == "succeeded")
        _maintain_until(agent, lambda: agent.active_count == 0)
        assert plane.completions == 1
        assert env.starts() == 1
    finally:
        plane.release.set()
        agent.stop()
