"""Operating a cluster from docs/cluster.md (issue 34), with real processes: two ``ql3 control``
replicas on PostgreSQL and a ``ql3 worker`` attached to both.

- A replica that hangs (SIGSTOP: it accepts connections and never answers) is left by the worker
  within the documented bound, read from the worker's own log (``silent_ms`` of its failover line),
  and by a CLI whose ``QL3_URL`` names both replicas.
- A worker restarted with other ``--slots`` and ``--label`` registers a new session with them, and
  the control plane places runs by them.
"""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pytest

from ql3.cluster.liveness import MOVE_BOUND_S
from tests.support.cluster import Cluster, P, add_task, start_runs, wait_terminal
from tests.support.databases import pg_admin_dsn
from tests.support.server import stop
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One database, replicas A and B, worker w1 with ``--server A --server B`` (for the module)."""
    admin = pg_admin_dsn()
    if admin is None:
        pytest.skip("PostgreSQL not configured (QL3_TEST_PG_DSN)")
    name = f"ql3_ops_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user, host = info.get("user") or "postgres", info.get("host") or "127.0.0.1"
    url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{info.get('port') or '5432'}/{name}"
    c = Cluster(base=tmp_path_factory.mktemp("ops"), db_url=url)
    try:
        c.start_replica("cp-a")
        c.start_replica("cp-b")
        c.start_worker("w1", 0, "--server", c.replicas[1].url, "--slots", "2")
        yield c
    finally:
        for replica in c.replicas:
            replica.process.send_signal(signal.SIGCONT)
        c.stop_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def _failovers(log: str) -> list[dict[str, str]]:
    lines = [line for line in log.splitlines() if "action=worker.failover" in line]
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in lines]


def test_a_hung_replica_is_left_within_the_documented_bound(cluster: Cluster) -> None:
    a, b = cluster.replicas
    worker = cluster.workers[0]
    with cluster.api(1) as api:
        add_task(api, "hung-probe", "true")
    before = len(_failovers(worker.log()))

    # When replica A freezes: it keeps accepting connections and never answers
    a.process.send_signal(signal.SIGSTOP)
    try:
        # Then the worker moves to B, within the bound its own log states
        moved = wait_for(
            lambda: _failovers(worker.log())[before:] or None,
            what="the worker's failover line",
            detail=lambda: worker.log()[-3000:],
        )

        assert int(moved[0]["silent_ms"]) <= MOVE_BOUND_S * 1000, moved[0]
        # and pulls from it: a run started through B succeeds
        with cluster.api(1) as api:
            [run_id] = start_runs(api, "hung-probe", 1)
            assert wait_terminal(api, [run_id], timeout_s=30)[run_id] == "succeeded", cluster.logs()

        # And a CLI that names both replicas answers from B (its probe skips A), a write included
        started = cluster.cli("run", "start", "hung-probe", "-q", env={"QL3_URL": f"{a.url},{b.url}"})
        assert started.returncode == 0, started.stderr
        with cluster.api(1) as api:
            assert api.get(f"{P}/runs/{started.stdout.strip()}").status_code == 200
    finally:
        a.process.send_signal(signal.SIGCONT)


def test_a_worker_restarted_with_other_slots_and_labels_registers_them(cluster: Cluster) -> None:
    worker = cluster.workers[0]
    with cluster.api(1) as api:
        add_task(api, "gpu-only", "true", require={"gpu": "yes"})

    # When the worker is stopped and started again with more slots and a new label (approved by an
    # admin first: a credential is bound to its worker's labels, docs/security.md), same home
    stop(worker.process)
    cluster.workers.remove(worker)
    approved = cluster.cli("worker", "approve", "w1", "--label", "gpu=yes", replica=1)
    assert approved.returncode == 0, approved.stderr
    restarted = cluster.start_worker(
        "w1",
        0,
        "--server",
        cluster.replicas[1].url,
        "--slots",
        "5",
        "--label",
        "gpu=yes",
        token_file=worker.token_file,
    )

    # Then it runs (no "registered with different content"), with the new capacity and label
    with cluster.api(1) as api:
        shown = api.get(f"{P}/workers/w1").json()
        assert shown["slots"] == 5 and shown["labels"] == {"gpu": "yes"}, shown
        [run_id] = start_runs(api, "gpu-only", 1)
        assert wait_terminal(api, [run_id], timeout_s=30)[run_id] == "succeeded", cluster.logs()
    assert "different content" not in restarted.log()
