"""One run, one copy, when a remote worker is lost for a while (docs/reliability.md "Time"): a worker
holding eight long retry-safe runs is frozen (SIGSTOP) or cut off by a network namespace past its
lease, with a second worker ready to take the retries. Every command holds an exclusive ``flock`` on
a file of its run while it works and records it when it finds the lock held by another copy: none
does. The first copies are stopped by their host's executor at the local fence deadline, before the
control plane re-grants their runs; every run succeeds once on the second worker, and what the first
worker sends once it is back changes nothing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.cluster import Cluster, P, TcpProxy, add_task, start_runs, wait_terminal
from tests.support.databases import PgDatabase
from tests.support.netns import NetnsLink, netns_available

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
RUNS = 8
LEASE = {"QL3_RUN_LEASE_MS": "5000"}
WORK_S = 20  # longer than the re-grant wait: a copy nobody stopped would overlap its retry


@pytest.fixture
def cluster(tmp_path: Path, pg_database: PgDatabase) -> Iterator[Cluster]:
    c = Cluster(base=tmp_path, db_url=pg_database.url)
    try:
        c.start_replica("cp-a", env=LEASE)
        yield c
    finally:
        for worker in c.workers:
            if worker.process.poll() is None:
                os.kill(worker.process.pid, signal.SIGCONT)
        c.stop_all()


def _command(locks: Path, ledger: Path) -> str:
    """Start, hold the run's lock while working, end; a copy that finds the lock held says so and waits."""
    return (
        f"exec 9>>{locks}/$QL3_RUN_ID; "
        f'flock -n 9 || {{ echo "$QL3_ATTEMPT_ID overlap" >> {ledger}; flock 9; }}; '
        f'echo "$QL3_ATTEMPT_ID start" >> {ledger}; sleep {WORK_S}; echo "$QL3_ATTEMPT_ID end" >> {ledger}'
    )


def _lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def _wait_starts(ledger: Path, n: int, timeout_s: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        starts = [line.split()[0] for line in _lines(ledger) if line.endswith(" start")]
        if len(starts) >= n:
            return starts
        time.sleep(0.05)
    pytest.fail(f"only {_lines(ledger)} started")


def _scenario(cluster: Cluster, tmp_path: Path, fault: str) -> None:
    locks, ledger = tmp_path / "locks", tmp_path / "ledger"
    locks.mkdir()
    link: NetnsLink | None = None
    proxy: TcpProxy | None = None
    try:
        if fault == "netns":
            link = NetnsLink(f"ql3t{os.getpid() % 100000}")
            port = urlsplit(cluster.replicas[0].url).port
            assert port is not None
            proxy = TcpProxy(port, host=link.host_ip)
            w1 = cluster.start_worker(
                "w1", 0, "--slots", str(RUNS), server=proxy.url, env=LEASE, prefix=link.prefix
            )
        else:
            w1 = cluster.start_worker("w1", 0, "--slots", str(RUNS), env=LEASE)
        with cluster.api(0) as api:
            add_task(api, "long", _command(locks, ledger), max_attempts=2, retry_safe=True, grace_ms=1000)
            run_ids = start_runs(api, "long", RUNS)
            first = _wait_starts(ledger, RUNS)

            # When the worker holding all eight is lost past its lease, with another worker ready
            if link is not None:
                link.cut()
            else:
                os.kill(w1.process.pid, signal.SIGSTOP)
            cluster.start_worker("w2", 0, "--slots", str(RUNS), env=LEASE)

            # Then every run succeeds on its second attempt, and no two copies ever held a run at once
            statuses = wait_terminal(api, run_ids, timeout_s=90)
            assert set(statuses.values()) == {"succeeded"}, (statuses, cluster.logs())
            lines = _lines(ledger)
            assert not [line for line in lines if line.endswith(" overlap")], lines
            assert not [a for a in first if f"{a} end" in lines], "a first copy ran to its end"
            for run_id in run_ids:
                run = api.get(f"{P}/runs/{run_id}").json()
                assert (run["status"], run["attempt"], run["exit_code"]) == ("succeeded", 2, 0), run

            # And once the first worker is back, what it sends for the old attempts changes nothing
            if link is not None:
                link.restore()
            else:
                os.kill(w1.process.pid, signal.SIGCONT)
            time.sleep(8.0)  # its renewals are refused, its receipts (stopped copies) reported late
            for run_id in run_ids:
                run = api.get(f"{P}/runs/{run_id}").json()
                assert (run["status"], run["attempt"], run["exit_code"]) == ("succeeded", 2, 0), run
                items = api.get(f"{P}/runs/{run_id}/events", params={"limit": 200}).json()["items"]
                assert [e["type"] for e in items].count("run.succeeded") == 1
            assert not [line for line in _lines(ledger) if line.endswith(" overlap")]
    finally:
        if proxy is not None:
            proxy.cut()
        if link is not None:
            link.close()


def test_a_frozen_worker_never_runs_a_copy_beside_its_retry(cluster: Cluster, tmp_path: Path) -> None:
    _scenario(cluster, tmp_path, "sigstop")


@pytest.mark.skipif(not netns_available(), reason="network namespaces need root and iproute2")
def test_a_cut_off_worker_never_runs_a_copy_beside_its_retry(cluster: Cluster, tmp_path: Path) -> None:
    _scenario(cluster, tmp_path, "netns")
