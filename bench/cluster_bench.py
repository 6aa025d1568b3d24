"""Cluster mode by hand (docs/cluster.md): ``ql3 control`` replicas and remote ``ql3 worker``s on a
fresh PostgreSQL database per configuration, real processes; then procrastinate and pgqueuer on the
same PostgreSQL server in the same session (bench/peers/run_peers.py, from bench/.venv-peers made by
bench/setup-peers). Prints numbers and writes JSON; asserts no timing.

Per configuration (1, 2 and 3 replicas by default, always ``--workers`` workers):

  idle pull latency: the workers idle in their long-poll, runs started one at a time; per run the
  database's own created -> started interval (both stamped with the database clock; ``started`` is
  the running ACK, sent once the command's process exists), p50/p99.
  throughput: ``--runs`` runs of ``true`` submitted through the replicas' API (several requests in
  flight, spread over the replicas), runs/s from the first submission until all succeeded, and
  the database's committed transactions per run in that window (pg_stat_database.xact_commit,
  everything included: run creation, the replicas' loops, the long-polls, the bench's polling).

    bench/setup-peers   # once
    QL3_TEST_PG_DSN=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python bench/cluster_bench.py \\
        --replicas 1,2,3 --workers 3 --runs 2000 --idle 30
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.cluster import (  # noqa: E402
    Cluster,
    P,
    add_task,
    start_runs,
    start_runs_concurrently,
    wait_terminal,
)

PEERS_PYTHON = ROOT / "bench" / ".venv-peers" / "bin" / "python"
MAX_RUNS = 100_000
MAX_IDLE = 1_000


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


def one_configuration(admin: str, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"ql3_cluster_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user, host = info.get("user") or "postgres", info.get("host") or "127.0.0.1"
    url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{info.get('port') or '5432'}/{name}"
    base = Path(tempfile.mkdtemp(prefix="ql3-cluster-bench-"))
    cluster = Cluster(base=base, db_url=url)
    result: dict[str, Any] = {"replicas": replicas, "workers": args.workers, "slots": args.slots}
    try:
        for i in range(replicas):
            cluster.start_replica(f"cp-{i}")
        urls = [r.url for r in cluster.replicas]
        for i in range(args.workers):
            # attached first to replica i mod n, knowing every replica
            servers = [arg for j in range(1, replicas) for arg in ("--server", urls[(i + j) % replicas])]
            cluster.start_worker(f"w{i}", i % replicas, "--slots", str(args.slots), *servers)
        with cluster.api(0) as api:
            add_task(api, "nop", "true")
            # idle latency: every worker waits in its long-poll; each run is started alone
            latencies = []
            idle_ids: list[str] = []
            for _ in range(args.idle):
                [run_id] = start_runs(api, "nop", 1)
                idle_ids.append(run_id)
                wait_terminal(api, [run_id])
                run = api.get(f"{P}/runs/{run_id}").json()
                latencies.append(float(run["started_at_ms"] - run["created_at_ms"]))
                time.sleep(0.2)  # back to idle: every worker is in its long-poll again
            if latencies:
                result["idle_created_to_started_ms"] = {
                    "p50": percentile(latencies, 0.5),
                    "p99": percentile(latencies, 0.99),
                    "n": len(latencies),
                }
        commits_before = xact_commits(url)
        began = time.monotonic()
        start_runs_concurrently(cluster, list(range(replicas)), "nop", args.runs, threads_per_replica=2)
        submitted = time.monotonic() - began
        succeeded = wait_succeeded(url, args.runs + args.idle, timeout_s=900) - args.idle
        elapsed = time.monotonic() - began
        time.sleep(1.0)  # live backends flush their statistics at most a second late
        commits = xact_commits(url) - commits_before
        with psycopg.connect(url, autocommit=True) as conn:
            # the first command started to the last run finished, database clock (like the peers'
            # "steady" figure: submission and start-up excluded)
            row = conn.execute(
                "SELECT min(started_at_ms), max(finished_at_ms), count(*) FROM runs "
                "WHERE status = 'succeeded' AND NOT (id = ANY(%s))",
                (idle_ids,),
            ).fetchone()
        steady = None
        if row is not None and row[0] is not None and int(row[1]) > int(row[0]):
            steady = round((int(row[2]) - 1) / ((int(row[1]) - int(row[0])) / 1000), 1)
        result["throughput"] = {
            "runs": args.runs,
            "succeeded": succeeded,
            "submission_s": round(submitted, 2),
            "seconds": round(elapsed, 2),
            "runs_per_s": round(args.runs / elapsed, 1),
            "steady_runs_per_s": steady,
            "db_transactions_per_run": round(commits / args.runs, 1),
        }
        result["load_1m_after"] = round(os.getloadavg()[0], 2)
    finally:
        cluster.stop_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    print(json.dumps(result), flush=True)
    return result


def peers(admin: str, args: argparse.Namespace, out: Path) -> dict[str, Any] | None:
    """procrastinate and pgqueuer on the same server, one repetition, the ql3 workers' concurrency."""
    if not PEERS_PYTHON.exists():
        print(f"no {PEERS_PYTHON}: run bench/setup-peers for the peers' figures", file=sys.stderr)
        return None
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user, host = info.get("user") or "postgres", info.get("host") or "127.0.0.1"
    server = f"postgresql://{user}@{host}:{info.get('port') or '5432'}"
    json_path = out.with_name(out.stem + "-peers.json")
    done = subprocess.run(
        [
            str(PEERS_PYTHON),
            str(ROOT / "bench" / "peers" / "run_peers.py"),
            "--peers",
            "procrastinate,pgqueuer",
            "--jobs",
            str(args.runs),
            "--repeat",
            "1",
            "--latency-samples",
            str(args.idle),
            "--concurrency",
            str(args.workers * args.slots),
            "--pg-url",
            server,
            "--json",
            str(json_path),
        ],
        check=False,
        timeout=1800,
    )
    if done.returncode != 0 or not json_path.exists():
        print(f"the peers' run failed (exit {done.returncode})", file=sys.stderr)
        return None
    data: dict[str, Any] = json.loads(json_path.read_text())
    summary: dict[str, Any] = {}
    for peer in data.get("peers", []):
        runs = peer.get("throughput") or []
        latency = peer.get("latency") or {}
        summary[peer["name"]] = {
            "jobs_per_s": peer.get("median_jobs_per_s"),
            "steady_jobs_per_s": peer.get("median_steady_jobs_per_s"),
            "idle_p50_ms": latency.get("p50_ms"),
            "idle_p99_ms": latency.get("p99_ms"),
            "db_transactions_per_job": runs[0].get("db_transactions_per_job") if runs else None,
            "errors": peer.get("errors", []),
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", default="1,2,3", help="comma-separated replica counts (1-8 each)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--idle", type=int, default=30)
    parser.add_argument("--no-peers", action="store_true", help="ql3 only")
    parser.add_argument("--out", default="bench/results/cluster.json")
    args = parser.parse_args()
    try:
        counts = [int(part) for part in args.replicas.split(",")]
    except ValueError:
        parser.error("--replicas: comma-separated integers")
    if not counts or not all(1 <= n <= 8 for n in counts):
        parser.error("--replicas: each count must be 1-8")
    if not 1 <= args.workers <= 16 or not 1 <= args.slots <= 64:
        parser.error("--workers must be 1-16 and --slots 1-64")
    if not 1 <= args.runs <= MAX_RUNS or not 0 <= args.idle <= MAX_IDLE:
        parser.error(f"--runs must be 1-{MAX_RUNS} and --idle 0-{MAX_IDLE}")
    admin = os.environ.get("QL3_TEST_PG_DSN")
    if not admin:
        parser.error("QL3_TEST_PG_DSN must name a PostgreSQL server the bench may create databases on")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "load_1m_before": round(os.getloadavg()[0], 2),
        "ql3": [one_configuration(admin, n, args) for n in counts],
    }
    if not args.no_peers:
        result["peers"] = peers(admin, args, out)
    result["load_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
