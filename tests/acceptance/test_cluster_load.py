"""A cluster of real processes on PostgreSQL (docs/cluster.md): two ``ql3 control`` replicas and two
remote ``ql3 worker``s run 200 ledger runs exactly once each; a worker killed with SIGKILL in the
middle of a load is restarted and no run executes twice; a cancel on one replica stops a run whose
worker is attached to the other, and the stop is released only after its dispatch settled."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.cluster_helpers import Cluster, P, add_task, start_runs, wait_terminal
from tests.acceptance.conftest import PgDatabase, stop

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
RUNS = 200


@pytest.fixture
def cluster(tmp_path: Path, pg_database: PgDatabase) -> Iterator[Cluster]:
    c = Cluster(base=tmp_path, db_url=pg_database.url)
    try:
        c.start_replica("cp-a")
        c.start_replica("cp-b")
        yield c
    finally:
        c.stop_all()


def test_two_replicas_and_two_workers_run_every_run_exactly_once(cluster: Cluster, tmp_path: Path) -> None:
    # Given two workers, one attached to each replica
    cluster.start_worker("w1", 0, "--slots", "4")
    cluster.start_worker("w2", 1, "--slots", "4")
    ledger = tmp_path / "ledger"
    with cluster.api(0) as a, cluster.api(1) as b:
        add_task(a, "ledger", f'echo "$QL3_RUN_ID $QL3_ATTEMPT_ID" >> {ledger}')

        # When 200 runs are started, half through each replica
        run_ids = start_runs(a, "ledger", RUNS // 2) + start_runs(b, "ledger", RUNS // 2)
        statuses = wait_terminal(a, run_ids)

        # Then every run succeeded, and the ledger has exactly one line per run
        assert Counter(statuses.values()) == {"succeeded": RUNS}, cluster.logs()
        lines = ledger.read_text().splitlines()
        assert len(lines) == RUNS
        assert sorted(line.split()[0] for line in lines) == sorted(run_ids)
        # And no attempt was claimed twice: one attempt and one lease generation per run
        attempts = {line.split()[1] for line in lines}
        assert len(attempts) == RUNS
        workers = {w["id"]: w for w in a.get(f"{P}/workers").json()["items"]}
        assert set(workers) == {"w1", "w2"}
        assert all(w["busy"] == 0 for w in workers.values())
    # And both workers took part
    with psycopg.connect(cluster.db_url) as conn:
        rows = conn.execute("SELECT worker_id, count(*) FROM run_attempts GROUP BY worker_id").fetchall()
    by_worker: dict[str, int] = {str(w): int(n) for w, n in rows}
    assert set(by_worker) == {"w1", "w2"} and sum(by_worker.values()) == RUNS


def test_a_worker_killed_mid_load_is_restarted_and_no_run_executes_twice(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given two workers busy with runs that take a moment each
    w1 = cluster.start_worker("w1", 0, "--slots", "3")
    cluster.start_worker("w2", 1, "--slots", "3")
    ledger = tmp_path / "ledger"
    command = (
        f'echo "$QL3_RUN_ID $QL3_ATTEMPT_ID start" >> {ledger}; sleep 0.5; '
        f'echo "$QL3_RUN_ID $QL3_ATTEMPT_ID end" >> {ledger}'
    )
    with cluster.api(0) as a:
        add_task(a, "slowish", command, max_attempts=3, retry_safe=True)
        run_ids = start_runs(a, "slowish", 30)
        # When w1 is killed with SIGKILL while it runs some of them, and started again
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = a.get(f"{P}/workers/w1").json()["busy"]
            if busy > 0 and ledger.exists() and len(ledger.read_text().splitlines()) >= 6:
                break
            time.sleep(0.05)
        w1.process.send_signal(signal.SIGKILL)
        w1.process.wait(timeout=10)
        cluster.restart_worker(w1, 1)  # back, attached to the other replica this time

        # Then every run succeeds, and each one ran to its end exactly once
        statuses = wait_terminal(a, run_ids)
        assert Counter(statuses.values()) == {"succeeded": len(run_ids)}, cluster.logs()
        ends = Counter(line.split()[0] for line in ledger.read_text().splitlines() if line.endswith(" end"))
        assert all(ends[run_id] == 1 for run_id in run_ids), ends
        # And an attempt that started twice never exists: re-adoption or a new attempt, never both
        starts = Counter(
            tuple(line.split()[:2]) for line in ledger.read_text().splitlines() if line.endswith(" start")
        )
        assert all(n == 1 for n in starts.values()), starts


def test_a_cancel_on_one_replica_stops_a_run_on_a_worker_of_the_other(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given a long run on a worker attached to replica B
    cluster.start_worker("w1", 1, "--slots", "2")
    pid_file = tmp_path / "pid"
    with cluster.api(0) as a:
        add_task(a, "long", f"echo $$ > {pid_file}; sleep 60 & wait", grace_ms=1000)
        [run_id] = start_runs(a, "long", 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and a.get(f"{P}/runs/{run_id}").json()["status"] != "running":
            time.sleep(0.05)
        while time.monotonic() < deadline and not pid_file.exists():
            time.sleep(0.05)
        pid = int(pid_file.read_text())

        # When it is cancelled through replica A
        assert a.post(f"{P}/runs/{run_id}/cancel").status_code == 200

        # Then it ends cancelled, and its whole process group is gone
        statuses = wait_terminal(a, [run_id])
        assert statuses[run_id] == "cancelled", cluster.logs()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
        # And the dispatch was committed as dispatched before the worker stopped it
        events = a.get(f"{P}/runs/{run_id}/events", params={"limit": 100}).json()["items"]
        types = [e["type"] for e in events]
        assert "run.cancel_dispatched" in types, types
        assert types.index("run.cancel_dispatched") < types.index("run.cancelled")
        view = a.get(f"{P}/runs/{run_id}/cancellation").json()
        assert view["dispatch"]["status"] == "dispatched"


def test_a_worker_drains_on_sigterm(cluster: Cluster, tmp_path: Path) -> None:
    # Given a worker running one run
    w1 = cluster.start_worker("w1", 0, "--slots", "2")
    done_file = tmp_path / "done"
    with cluster.api(0) as a:
        add_task(a, "drainee", f"sleep 1; echo ok > {done_file}")
        [run_id] = start_runs(a, "drainee", 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and a.get(f"{P}/runs/{run_id}").json()["status"] != "running":
            time.sleep(0.05)
        # When it gets SIGTERM
        w1.process.send_signal(signal.SIGTERM)
        # Then it finishes the run first, then exits 0 and goes offline
        assert w1.process.wait(timeout=30) == 0, w1.log()
        assert a.get(f"{P}/runs/{run_id}").json()["status"] == "succeeded"
        assert done_file.read_text() == "ok\n"
        assert a.get(f"{P}/workers/w1").json()["status"] == "offline"
    stop(w1.process)


def test_a_replica_killed_mid_load_loses_nothing_and_its_workers_move_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given two workers that know both replicas, one attached first to each
    a_url, b_url = cluster.replicas[0].url, cluster.replicas[1].url
    cluster.start_worker("w1", 0, "--slots", "3", "--server", b_url)
    cluster.start_worker("w2", 1, "--slots", "3", "--server", a_url)
    ledger = tmp_path / "ledger"
    command = f'sleep 0.2; echo "$QL3_RUN_ID $QL3_ATTEMPT_ID" >> {ledger}'
    with cluster.api(1) as b:
        add_task(b, "steady", command, max_attempts=3, retry_safe=True)
        run_ids = start_runs(b, "steady", 40)
        # When replica A is killed with SIGKILL while the runs are being worked on
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not ledger.exists() or len(ledger.read_text().split()) < 10):
            time.sleep(0.05)
        cluster.replicas[0].process.send_signal(signal.SIGKILL)
        cluster.replicas[0].process.wait(timeout=10)

        # Then replica B and the workers carry on: every run succeeds, each executed exactly once
        statuses = wait_terminal(b, run_ids)
        assert Counter(statuses.values()) == {"succeeded": len(run_ids)}, cluster.logs()
        lines = ledger.read_text().splitlines()
        assert sorted(line.split()[0] for line in lines) == sorted(run_ids)
        # And both workers are still online, now through B
        workers = {w["id"]: w["status"] for w in b.get(f"{P}/workers").json()["items"]}
        assert workers == {"w1": "online", "w2": "online"}
