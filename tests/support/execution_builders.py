"""Builders for the execution contract tests: workers, dispatchers and fences."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from ql3.application import lease_results, runs, workers
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.cluster.pull import PullRequest, pull_offer_id
from ql3.domain.digests import new_token, sha256_hex
from ql3.domain.ids import new_id
from ql3.domain.model import Project, Run, Task
from ql3.domain.offers import LeaseFence, Offer
from ql3.domain.workers import parse_capabilities
from ql3.ports.storage import Params, Row, Transaction
from tests.support.builders import seed_project, seed_task, start_run

SECRET = b"s" * 32


def register(
    db: Any,
    worker_id: str = "w1",
    *,
    slots: int = 4,
    labels: dict[str, str] | None = None,
    session_id: str | None = None,
    lease_ms: int = 30_000,
    executors: tuple[str, ...] = ("local_process",),
) -> workers.WorkerSession:
    caps: dict[str, Any] = {"executors": list(executors)}
    if labels:
        caps["labels"] = labels
    reg = db.transaction(
        lambda tx: workers.register(
            tx,
            worker_id=worker_id,
            session_id=session_id or new_id(),
            capabilities=parse_capabilities(caps),
            max_concurrent_runs=slots,
            session_lease_ms=lease_ms,
        )
    )
    session: workers.WorkerSession = reg.session
    return session


def dispatcher(db: Any, *, since: int = 0, **budget: Any) -> RunDispatcher:
    return RunDispatcher(
        db, lease_secret=SECRET, budget=DispatchBudget(**budget), incarnation_started_ms=since
    )


def queued(db: Any, n: int = 1, **spec: Any) -> tuple[Project, Task, list[Run]]:
    project = seed_project(db)
    task = seed_task(db, project, name=spec.pop("name", "job"), **spec)
    created = [start_run(db, project, task)[0] for _ in range(n)]
    return project, task, created


def start(db: Any, offer: Offer, *, seq: int = 1, token: str = "cb-token") -> LeaseFence:
    f = offer.fence
    db.transaction(lambda tx: lease_results.ack_starting(tx, f))
    db.transaction(
        lambda tx: lease_results.ack_running(
            tx,
            f,
            pid=4242,
            handle="ql3lp1.test",
            log_artifact_id="a",
            callback_sequence=seq,
            callback_token_digest=sha256_hex(token),
        )
    )
    return f


def run_of(db: Any, project: Project, run_id: str) -> Run:
    result: Run = db.transaction(lambda tx: runs.get_run(tx, project.id, run_id))
    return result


def race_two_dispatchers(harness: Any) -> list[str]:
    """Two dispatchers on two real connections claim until both find nothing three times; returns the
    attempt ids offered by either (a claim error in either thread fails the test)."""

    other = harness.second_connection()
    offers: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def drive(db: Any, sink: list[str]) -> None:
        d = dispatcher(db, lease_ms=600_000)
        try:
            idle = 0
            while idle < 3:
                result = d.dispatch_once()
                if result.offer is None:
                    idle += 1
                    continue
                idle = 0
                sink.append(result.offer.fence.attempt_id)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [
        threading.Thread(target=drive, args=(db, s))
        for db, s in zip([harness.db, other], offers, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    other.close()
    assert not errors, errors
    return offers[0] + offers[1]


Interference = Callable[[Transaction, Params], None]


class StatementLog:
    """A transaction that records the name of every statement it runs, in order, and every channel it
    notifies (``channels``).

    ``first`` lets another writer in just before a named statement (once): ``first[name](tx, params)``
    runs in the same transaction, as if a concurrent transaction had committed that write a moment
    earlier. It is how a test reaches the paths that answer a lost compare-and-set. ``name#2`` names
    the statement's second run in the transaction (``name`` alone is its first).
    """

    def __init__(self, tx: Transaction, first: Mapping[str, Interference] | None = None) -> None:
        self._tx = tx
        self._first = dict(first or {})
        self.dialect = tx.dialect
        self.names: list[str] = []
        self.channels: list[str] = []

    def _enter(self, query: str, params: Params | None) -> None:
        self.names.append(query)
        seen = self.names.count(query)
        interfere = self._first.pop(query if seen == 1 else f"{query}#{seen}", None)
        if interfere is not None:
            interfere(self._tx, params or {})

    def now_ms(self) -> int:
        return self._tx.now_ms()

    def one(self, query: str, params: Params | None = None) -> Row | None:
        self._enter(query, params)
        return self._tx.one(query, params)

    def all(self, query: str, params: Params | None = None) -> list[Row]:
        self._enter(query, params)
        return self._tx.all(query, params)

    def run(self, query: str, params: Params | None = None) -> int:
        self._enter(query, params)
        return self._tx.run(query, params)

    def notify(self, channel: str) -> None:
        self.channels.append(channel)
        self._tx.notify(channel)

    def locks(self) -> list[str]:
        """The row reads in order: locked (``*_lock*``) and plain (``*_get``)."""
        return [n for n in self.names if "_lock" in n or n.endswith("_get")]


def request(session: workers.WorkerSession, token: str | None = None) -> PullRequest:
    token = token or new_token()
    return PullRequest(
        worker_id=session.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        offer_id=pull_offer_id(session.worker_id, token),
        lease_token=token,
    )


def live_leases(db: Any) -> int:
    return int(db.raw("SELECT count(*) AS n FROM run_leases WHERE status = 'leased'")[0]["n"])


def busy_and_leased(db: Any) -> list[tuple[str, int, int]]:
    """Per worker: its busy-slot counter (``active_leases``) and the number of its ``leased`` leases."""
    rows = db.raw(
        "SELECT w.worker_id, w.active_leases, "
        "(SELECT count(*) FROM run_leases l WHERE l.worker_id = w.worker_id AND l.status = 'leased') AS n "
        "FROM workers w ORDER BY w.worker_id"
    )
    return [(str(r["worker_id"]), int(r["active_leases"]), int(r["n"])) for r in rows]
