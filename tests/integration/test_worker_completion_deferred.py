"""A completion the control plane cannot record (its database on a full disk: ``StorageUnavailable``)
keeps the receipt and is tried again at each maintenance pass, without ending that pass; an exited
process whose lease cannot be renewed meanwhile is not stopped as a lost lease (nothing runs, its
receipt waits). Once the writes go through, the run completes with its real exit code
(docs/operations.md "A full disk")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.application import auth, runs, tasks
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.application.gateway import InProcessControlPlane
from ql3.domain.errors import StorageUnavailable
from ql3.domain.journal import JournalUnavailable
from ql3.domain.offers import LeaseFence, Offer
from ql3.execution.receipts import receipt_path, receipt_published
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.agent import WorkerAgent
from ql3.worker.config import WorkerConfig
from tests.support.waits import wait_for

LEASE_MS = 5_000


ALL_WRITES = frozenset({"complete", "renew", "heartbeat"})


class FullDisk(InProcessControlPlane):
    """While ``full``, the writes named in ``refuse`` fail as SQLite's do on a full disk."""

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db)
        self.full = False
        self.refuse: frozenset[str] = ALL_WRITES
        self.refused: dict[str, int] = {}

    def _write(self, name: str, call: Any) -> Any:
        if self.full and name in self.refuse:
            self.refused[name] = self.refused.get(name, 0) + 1
            raise StorageUnavailable("database or disk is full")
        return call()

    def complete(self, fence: LeaseFence, **kwargs: Any) -> Any:
        return self._write("complete", lambda: super(FullDisk, self).complete(fence, **kwargs))

    def renew(self, fence: LeaseFence, lease_ms: int) -> Any:
        return self._write("renew", lambda: super(FullDisk, self).renew(fence, lease_ms))

    def heartbeat(self, session: Any) -> Any:
        return self._write("heartbeat", lambda: super(FullDisk, self).heartbeat(session))


class Clock:
    """The worker's clock: real time plus a skip, so a lease's age can pass without waiting for it."""

    def __init__(self) -> None:
        self.skip_ms = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.skip_ms


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.db = SqliteDatabase(tmp_path / "ql3.db")
        self.db.migrate()
        owner = self.db.transaction(auth.bootstrap_owner)
        assert owner is not None
        self.project = owner.project
        self.home = tmp_path / "worker"
        self.clock = Clock()
        self.plane = FullDisk(self.db)
        self.config = WorkerConfig(
            worker_id="w1", home=self.home, slots=4, run_lease_ms=LEASE_MS, session_lease_ms=LEASE_MS
        )
        self.agent = WorkerAgent(self.plane, self.config, clock=self.clock)
        self._tasks = 0

    def claim(self, command: str) -> Offer:
        self._tasks += 1
        task = self.db.transaction(
            lambda tx: tasks.create_task(tx, self.project.id, f"t{self._tasks}", {"command": command})
        ).task
        self.db.transaction(
            lambda tx: runs.create_run(tx, runs.CreateRun(project_id=self.project.id, task=task))
        )
        d = RunDispatcher(
            self.db,
            lease_secret=b"k" * 32,
            budget=DispatchBudget(),
            incarnation_started_ms=0,
        )
        offer = d.dispatch_once().offer
        assert offer is not None
        return offer

    def run(self, run_id: str) -> Any:
        return self.db.transaction(lambda tx: runs.get_run(tx, self.project.id, run_id))

    def receipt_written(self, offer: Offer) -> bool:
        return receipt_published(receipt_path(self.config.receipts_dir, offer.fence.attempt_id))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    e.agent.start()
    try:
        yield e
    finally:
        e.agent.stop()
        e.db.close()


def test_a_refused_completion_is_deferred_to_the_next_pass_and_keeps_the_exit_code(env: Env) -> None:
    # Given a command that exits 7 while the control plane cannot record a completion
    env.plane.refuse = frozenset({"complete"})
    env.plane.full = True
    offer = env.claim("exit 7")
    assert env.agent.receive(offer) == "started"
    wait_for(
        lambda: env.receipt_written(offer) and env.plane.refused.get("complete", 0) >= 1,
        what="the exit and a refused completion",
    )

    # When maintenance passes run while it stays so
    for _ in range(3):
        assert env.agent.maintain() is False  # the pass itself goes on: nothing raised from the settle
    # Then each pass tried once more, the receipt is kept and the run is still running
    assert env.plane.refused["complete"] >= 4
    assert env.receipt_written(offer)
    assert env.run(offer.fence.run_id).status == "running"

    # And once the writes go through, the next pass completes it with the real exit code
    env.plane.full = False
    env.agent.maintain()
    run = env.run(offer.fence.run_id)
    assert (run.status, run.exit_code) == ("failed", 7)
    assert not receipt_path(env.config.receipts_dir, offer.fence.attempt_id).exists()
    assert env.agent.active_count == 0


def test_an_exited_process_is_not_stopped_for_a_lease_it_cannot_renew(env: Env) -> None:
    # Given a command that exited 7 and whose completion, renewals and heartbeats are all refused
    offer = env.claim("exit 7")
    assert env.agent.receive(offer) == "started"
    env.plane.full = True
    wait_for(
        lambda: env.receipt_written(offer) and env.plane.refused.get("complete", 0) >= 1,
        what="the exit and a refused completion",
    )

    # When, by the worker's clock, more than half of the lease passes without a renewal
    env.clock.skip_ms = LEASE_MS // 2 + 1
    for _ in range(2):
        with pytest.raises(StorageUnavailable):  # the unreachable control plane, reported by the pass
            env.agent.maintain()
    assert env.plane.refused["renew"] >= 1

    # Then the attempt is still the worker's to complete (no lease-loss stop took it over), and once the
    # writes go through it completes with the real exit code
    assert env.agent.active_count == 1
    env.plane.full = False
    env.agent.maintain()
    run = env.run(offer.fence.run_id)
    assert (run.status, run.exit_code) == ("failed", 7)
    assert env.agent.active_count == 0


def test_a_started_row_the_journal_cannot_take_is_written_later_and_the_run_completes(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a journal that cannot take the `started` row (its disk filled right after the spawn)
    journal = env.agent.journal
    real_advance = journal.advance
    refused: list[str] = []

    def advance(offer_id: str, **kwargs: Any) -> Any:
        if kwargs.get("to_state") == "started" and env.plane.full:
            refused.append(offer_id)
            raise JournalUnavailable()
        return real_advance(offer_id, **kwargs)

    monkeypatch.setattr(journal, "advance", advance)
    env.plane.refuse = frozenset()
    env.plane.full = True

    # When a command that exits 7 is received
    offer = env.claim("exit 7")
    assert env.agent.receive(offer) == "launching"

    # Then it runs all the same, is kept (not dropped as a failed intake) and waits for the journal
    wait_for(lambda: env.receipt_written(offer), what="the command's receipt")
    assert refused and env.agent.active_count == 1
    env.agent.maintain()  # the journal still refuses: the pass goes on, nothing is completed yet
    record = journal.find_by_attempt(offer.fence.attempt_id)
    assert record is not None and record.state == "launching"
    assert env.run(offer.fence.run_id).status != "failed"

    # And once the journal takes writes again, maintenance journals `started`, sends the running ACK
    # and completes the run with its real exit code
    env.plane.full = False
    wait_for(
        lambda: env.agent.maintain() is False and env.run(offer.fence.run_id).status == "failed",
        what="the run to complete",
    )
    assert env.run(offer.fence.run_id).exit_code == 7
    assert env.agent.active_count == 0
