"""The worker agent over a real SQLite control plane: the environment its integration tests share."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from ql3.application import runs
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.application.gateway import InProcessControlPlane
from ql3.domain.offers import Offer
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.agent import WorkerAgent
from ql3.worker.config import WorkerConfig


class Crash(Exception):
    """Simulates the process dying at a fault point."""


@dataclasses.dataclass
class Env:
    """A migrated SQLite control plane, a worker home, and a task whose every start appends to ``marker``."""

    db: SqliteDatabase
    home: Path
    marker: Path
    project: Any
    task: Any

    def agent(self, fault: str | None = None) -> WorkerAgent:
        def hook(point: str) -> None:
            if point == fault:
                raise Crash(point)

        return WorkerAgent(
            InProcessControlPlane(self.db),
            WorkerConfig(worker_id="w1", home=self.home / "worker", slots=4),
            clock=lambda: time.time_ns() // 1_000_000,
            fault=hook,
        )

    def queue_and_claim(self, agent: WorkerAgent) -> Offer:
        self.db.transaction(
            lambda tx: runs.create_run(tx, runs.CreateRun(project_id=self.project.id, task=self.task))
        )
        d = RunDispatcher(self.db, lease_secret=b"k" * 32, budget=DispatchBudget(), incarnation_started_ms=0)
        offer = d.dispatch_once().offer
        assert offer is not None
        return offer

    def starts(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0

    def run_status(self, run_id: str) -> str:
        return str(self.db.transaction(lambda tx: runs.get_run(tx, self.project.id, run_id)).status)
