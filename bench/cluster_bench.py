"""Cluster mode by hand (docs/cluster.md): ``ql3 control`` replicas and remote ``ql3 worker``s on a
fresh PostgreSQL database, real processes. Prints numbers and writes JSON; asserts no timing.

  idle pull latency: one idle worker, runs started one at a time; per run the database's own
  created -> started interval (both stamped with the database clock), p50/p99.
  throughput: N runs of ``true`` started at once, runs/s until all succeeded, and the database's
  committed transactions per run in that window (pg_stat_database, everything included).

    QL3_TEST_PG_DSN=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python bench/cluster_bench.py \
        --replicas 2 --workers 2 --runs 200 --idle 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.acceptance.cluster_helpers import Cluster, P, add_task, start_runs, wait_terminal


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def xact_commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def wait_succeeded(url: str, n: int, *, timeout_s: float) -> int:
    """Poll the database directly (one query per 0.2 s), not the API, until ``n`` runs succeeded."""
    deadline = time.monotonic() + timeout_s
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone()
            done = int(row[0]) if row else 0
            if done >= n:
                break
            time.sleep(0.2)
    return done


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--idle", type=int, default=30)
    parser.add_argument("--out", default="bench/results/cluster.json")
    args = parser.parse_args()
    admin = os.environ["QL3_TEST_PG_DSN"]
    name = f"ql3_cluster_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user, host = info.get("user") or "postgres", info.get("host") or "127.0.0.1"
    url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{info.get('port') or '5432'}/{name}"
    base = Path(tempfile.mkdtemp(prefix="ql3-cluster-bench-"))
    cluster = Cluster(base=base, db_url=url)
    result: dict[str, object] = {"replicas": args.replicas, "workers": args.workers, "slots": args.slots}
    try:
        for i in range(args.replicas):
            cluster.start_replica(f"cp-{i}")
        for i in range(args.workers):
            cluster.start_worker(f"w{i}", i % args.replicas, "--slots", str(args.slots))
        with cluster.api(0) as api:
            add_task(api, "nop", "true")
            # idle latency: the worker waits in its long-poll; each run is started alone
            latencies = []
            for _ in range(args.idle):
                [run_id] = start_runs(api, "nop", 1)
                wait_terminal(api, [run_id])
                run = api.get(f"{P}/runs/{run_id}").json()
                latencies.append(float(run["started_at_ms"] - run["created_at_ms"]))
                time.sleep(0.2)  # back to idle: every worker is in its long-poll again
            result["idle_created_to_started_ms"] = {
                "p50": percentile(latencies, 0.5),
                "p99": percentile(latencies, 0.99),
                "n": len(latencies),
            }
            commits_before = xact_commits(url)
            began = time.monotonic()
            start_runs(api, "nop", args.runs)
            succeeded = wait_succeeded(url, args.runs + args.idle, timeout_s=600) - args.idle
            elapsed = time.monotonic() - began
            commits = xact_commits(url) - commits_before
            result["throughput"] = {
                "runs": args.runs,
                "succeeded": succeeded,
                "seconds": round(elapsed, 2),
                "runs_per_s": round(args.runs / elapsed, 1),
                # every transaction of the database in that window (replicas' loops, long-polls,
                # run creation and the bench's one count query every 0.2 s included), per run
                "db_transactions_per_run": round(commits / args.runs, 1),
            }
        result["load_1m_after"] = os.getloadavg()[0]
    finally:
        cluster.stop_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
