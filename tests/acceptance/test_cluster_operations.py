"""What a cluster started from the README must do besides running: a task's timeout is enforced on a
remote worker (its whole process group ends and the run is ``timed_out``), and an approval-required
task asked for on one replica and approved on another becomes one run that a remote worker executes
(real processes: two ``ql3 control`` replicas on PostgreSQL, one ``ql3 worker``; docs/cluster.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, P, add_task, start_runs, wait_terminal
from tests.support.databases import PgDatabase
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def cluster(tmp_path: Path, pg_database: PgDatabase) -> Iterator[Cluster]:
    c = Cluster(base=tmp_path, db_url=pg_database.url)
    try:
        c.start_replica("cp-a")
        c.start_replica("cp-b")
        c.start_worker("w1", 1, "--slots", "2")  # attached to replica B only
        yield c
    finally:
        c.stop_all()


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_timeout_ends_a_remote_run_and_its_whole_process_group(cluster: Cluster, tmp_path: Path) -> None:
    # Given a task that would run 60 s with a background child, a 1 s timeout and a 0.5 s grace
    pid_file = tmp_path / "pid"
    with cluster.api(0) as a:
        add_task(a, "slow", f"echo $$ > {pid_file}; sleep 60 & wait", timeout_ms=1000, grace_ms=500)

        # When it is started through replica A and runs on the worker of replica B
        [run_id] = start_runs(a, "slow", 1)
        statuses = wait_terminal(a, [run_id], timeout_s=40)

        # Then it is timed out, by its deadline, and nothing of its process group is left
        assert statuses[run_id] == "timed_out", cluster.logs()
        run = a.get(f"{P}/runs/{run_id}").json()
        assert run["started_at_ms"] is not None
        # not before its deadline, which counts from the spawn: after the run was created, and
        # before its running ACK (started_at_ms) was committed
        assert run["finished_at_ms"] - run["created_at_ms"] >= 1000
        pid = int(pid_file.read_text())
        wait_for(lambda: _gone(pid), 10, what=f"process {pid} to be gone")
        assert _gone(pid)
        types = [e["type"] for e in a.get(f"{P}/runs/{run_id}/events", params={"limit": 100}).json()["items"]]
        assert "run.timed_out" in types or "run.cancel_dispatched" in types, types


def test_an_approval_asked_on_one_replica_and_granted_on_another_runs_once_on_a_remote_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given an approval-required task and an approver
    ledger = tmp_path / "ledger"
    with cluster.api(0) as a:
        add_task(a, "deploy", f"echo deployed >> {ledger}", approval="required")
    issued = cluster.cli("token", "create", "--role", "approver", "--name", "alice", "--json")
    assert issued.returncode == 0, issued.stderr
    approver = {"Authorization": f"Bearer {json.loads(issued.stdout)['token']}"}
    # The requester is an operator: the owner issued the approver's token, so it may not ask and approve
    made = cluster.cli("token", "create", "--role", "operator", "--name", "otto", "--json")
    assert made.returncode == 0, made.stderr
    operator = {"Authorization": f"Bearer {json.loads(made.stdout)['token']}"}

    # When the operator starts it on replica A: a request, no run
    with cluster.api(0) as a:
        asked = a.post(f"{P}/tasks/deploy/runs", json={}, headers=operator)
        assert asked.status_code == 202, asked.text
        approval_id = asked.json()["approval"]["id"]
        assert a.get(f"{P}/runs").json()["items"] == []

    # And the approver approves it on replica B
    with cluster.api(1) as b:
        done = b.post(f"{P}/approvals/{approval_id}/approve", json={"reason_code": "ok"}, headers=approver)
        assert done.status_code == 200, done.text

        # Then exactly one run appears, made by the approved action, and the remote worker runs it once
        def all_succeeded() -> list[dict[str, object]] | None:
            items: list[dict[str, object]] = b.get(f"{P}/runs").json()["items"]
            return items if items and all(r["status"] == "succeeded" for r in items) else None

        items = wait_for(all_succeeded, 40, what="the approved action's run to succeed")
        assert [(r["status"], r["trigger_type"]) for r in items] == [("succeeded", "approved_action")]
        assert ledger.read_text() == "deployed\n"
        assert b.get(f"{P}/approvals/{approval_id}").json()["state"] == "consumed"
        actions = b.get(f"{P}/actions").json()["items"]
        assert [(x["approval_request_id"], x["status"]) for x in actions] == [(approval_id, "succeeded")]
