"""Log shipping with real processes on PostgreSQL (docs/cluster.md "Log shipping"): a remote
``ql3 worker`` attached to one ``ql3 control`` replica ships a task's output, and
``ql3 run logs --follow`` against a SECOND replica (no worker, no log files) shows every line in order
while the run goes on and ends when it ends; a task writing past the quota shows the marker."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, P, add_task, start_runs, wait_terminal
from tests.support.databases import PgDatabase
from tests.support.server import CLI, base_env

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CAP = 4096
LINES = 40
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


def follow(cluster: Cluster, run_id: str, replica: int) -> subprocess.Popen[str]:
    env = {
        **base_env(cluster.owner_home),
        "QL3_URL": cluster.replicas[replica].url,
        "QL3_TOKEN": cluster.token(),
    }
    return subprocess.Popen(
        [*CLI, "run", "logs", run_id, "--follow"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def test_follow_on_another_replica_shows_every_line_live_and_the_quota_marker(
    tmp_path: Path, pg_database: PgDatabase
) -> None:
    cluster = Cluster(base=tmp_path, db_url=pg_database.url)
    env = {"QL3_LOG_CAP_BYTES": str(CAP)}
    try:
        cluster.start_replica("cp-a", env=env)
        cluster.start_replica("cp-b", env=env)
        cluster.start_worker("w1", 0, env=env)
        with cluster.api(0) as api:
            # Given a task printing numbered lines with small sleeps, run by the worker of cp-a
            add_task(api, "count", f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.1; done")
            [run_id] = start_runs(api, "count", 1)

            # When `ql3 run logs --follow` runs against cp-b, which has no worker and no log files
            proc = follow(cluster, run_id, 1)
            assert proc.stdout is not None
            lines: list[str] = []
            status_at_first_line: list[str] = []

            def read() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if not lines:
                        status_at_first_line.append(str(api.get(f"{P}/runs/{run_id}").json()["status"]))
                    lines.append(line.rstrip("\n"))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                rc = proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                pytest.fail(f"follow did not end:\n{lines}\n{cluster.logs()}")
            reader.join(10)
            error = proc.stderr.read() if proc.stderr else ""
            for stream in (proc.stdout, proc.stderr):  # the process has ended: close its pipes
                if stream is not None:
                    stream.close()
            status = str(api.get(f"{P}/runs/{run_id}").json()["status"])

            # Then it showed every line in order, the first while the run was still going on, and it
            # ended by itself once the run was over
            assert rc == 0, error
            assert lines == [f"line {i}" for i in range(1, LINES + 1)], cluster.logs()
            assert status_at_first_line and status_at_first_line[0] not in TERMINAL
            assert status == "succeeded"

            # And the second replica serves the shipped log from its end and searches all of it
            whole = "".join(f"line {i}\n" for i in range(1, LINES + 1))
            with cluster.api(1) as other:
                tail = other.get(f"{P}/runs/{run_id}/logs", params={"from_end": 20}).json()
                before = other.get(f"{P}/runs/{run_id}/logs", params={"before": tail["offset"]}).json()
                found = other.get(f"{P}/runs/{run_id}/logs/search", params={"q": "LINE 17"}).json()
            assert tail["data"] == whole[tail["offset"] :] and tail["data"].endswith("line 40\n")
            assert (tail["size"], tail["complete"]) == (len(whole), True)
            assert before["data"] + tail["data"] == whole
            assert [m["offset"] for m in found["matches"]] == [whole.index("line 17")]

            # Given a task that writes far past the 4 KiB quota
            add_task(api, "flood", "head -c 20000 /dev/zero | tr '\\0' x; echo; echo after")
            [flood_id] = start_runs(api, "flood", 1)
            assert wait_terminal(api, [flood_id])[flood_id] == "succeeded", cluster.logs()

            # Then the second replica shows the first 4096 bytes, then the marker, and nothing more
            done = follow(cluster, flood_id, 1)
            out, err = done.communicate(timeout=60)
            assert done.returncode == 0, err
            assert out == "x" * CAP + f"\n[ql3: log truncated at {CAP} bytes]\n"
            stored = cluster.cli("run", "logs", flood_id, replica=0)
            assert stored.returncode == 0 and stored.stdout == out
            with cluster.api(1) as other:
                end = other.get(f"{P}/runs/{flood_id}/logs", params={"from_end": 100}).json()
                marker = other.get(f"{P}/runs/{flood_id}/logs/search", params={"q": "log truncated"}).json()
            assert end["data"].endswith(f"[ql3: log truncated at {CAP} bytes]\n") and end["size"] == len(out)
            assert [m["offset"] for m in marker["matches"]] == [out.index("log truncated")]
    finally:
        cluster.stop_all()
    # And the shipped chunks hold exactly the quota
    import psycopg

    with psycopg.connect(pg_database.url) as conn:
        row = conn.execute(
            "SELECT sum(octet_length(c.data)) FROM attempt_log_chunks c JOIN run_attempts a"
            " ON a.id = c.attempt_id WHERE a.run_id = %s",
            (flood_id,),
        ).fetchone()
    assert row is not None and int(row[0]) == CAP
