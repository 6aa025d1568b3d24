"""A remote ``ql3 worker`` runs a project script it never had (docs/scripts.md): the pulled offer
carries the script's content and digest over the authenticated worker channel, the worker checks the
digest and writes the file under its own home; the run's log is the script's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, P, start_runs, wait_terminal
from tests.support.databases import PgDatabase

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_remote_worker_runs_a_script_from_its_offer(tmp_path: Path, pg_database: PgDatabase) -> None:
    cluster = Cluster(base=tmp_path, db_url=pg_database.url)
    try:
        cluster.start_replica("cp-a")
        worker = cluster.start_worker("w1", 0)
        with cluster.api(0) as api:
            put = api.put(f"{P}/scripts/lib/greet.sh", json={"content": 'echo "remote $QL3_SCRIPT_PATH"\n'})
            assert put.status_code == 201, put.text
            made = api.post(f"{P}/tasks", json={"name": "greet", "script": "lib/greet.sh"})
            assert made.status_code == 201, made.text
            [run_id] = start_runs(api, "greet", 1)
            assert wait_terminal(api, [run_id]) == {run_id: "succeeded"}
            log = api.get(f"{P}/runs/{run_id}/logs").json()
        assert log["data"] == "remote lib/greet.sh\n"
        written = list(worker.home.rglob("scripts/*/greet.sh"))
        assert [p.read_text() for p in written] == ['echo "remote $QL3_SCRIPT_PATH"\n']
    finally:
        cluster.stop_all()
