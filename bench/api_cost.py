"""Server CPU per API submission, the API alone: ``python bench/api_cost.py [--runs N] [--profile OUT]``.

A real ``ql3 serve --slots 1`` (SQLite, or PostgreSQL with ``--kind postgres``) under
bench/ql3_instrumented.py whose one slot is held by a ``sleep``: the dispatcher, woken by each new
run, sees its worker's active set full and goes back to sleep without a read, so only the API (and
the server's idle loops) runs. One kept-alive HTTP connection posts ``--runs``
``POST /api/v1/projects/default/tasks/t/runs``; the server's CPU (utime + stime from /proc) is
read before and after, and with ``--profile`` the server runs under cProfile (per-thread CPU time)
and its merged statistics are dumped at exit. Run by hand, never from the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from ql3_bench import TICK_MS, InstrumentedServe, Store, cpu_ticks, load_1m  # noqa: E402

from ql3.application import runs, tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--kind", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.kind, Path(tmp) / "home")
        store.db.transaction(
            lambda tx: tasks.create_task(tx, store.project.id, "hold", {"command": "sleep 300"})
        )
        serve = InstrumentedServe(store, 1, args.profile)
        try:
            serve.wait_healthy()
            assert serve.client is not None
            hold = serve.client.post("/api/v1/projects/default/tasks/hold/runs", json={})
            hold_id = hold.raise_for_status().json()["id"]
            while (
                store.db.transaction(lambda tx: runs.get_run(tx, store.project.id, hold_id)).status
                != "running"
            ):
                time.sleep(0.05)
            for _ in range(20):  # warm-up: imports, first statements, the connection
                serve.client.post("/api/v1/projects/default/tasks/t/runs", json={}).raise_for_status()
            time.sleep(1.0)
            c0, cpu0 = serve.counters(), cpu_ticks(serve.proc.pid)
            start = time.perf_counter()
            for _ in range(args.runs):
                serve.client.post("/api/v1/projects/default/tasks/t/runs", json={}).raise_for_status()
            wall = time.perf_counter() - start
            cpu1, c1 = cpu_ticks(serve.proc.pid), serve.counters()
            delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in set(c0) | set(c1) if k != "stages"}
            print(
                json.dumps(
                    {
                        "kind": args.kind,
                        "runs": args.runs,
                        "cpu_ms_per_submission": round((cpu1[0] - cpu0[0]) * TICK_MS / args.runs, 3),
                        "submissions_per_s": round(args.runs / wall, 1),
                        "transactions_per_submission": {
                            k: round(v / args.runs, 2)
                            for k, v in sorted(delta.items())
                            if isinstance(v, int) and v
                        },
                        "load_1m_after": load_1m(),
                    }
                )
            )
            serve.client.post(f"/api/v1/projects/default/runs/{hold_id}/cancel").raise_for_status()
        finally:
            serve.stop()
            store.close()


if __name__ == "__main__":
    main()
