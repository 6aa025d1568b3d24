"""Steady-state CPU per run of ``ql3 serve`` on a backlog: the server's ``utime + stime`` (and with its
reaped children) between the ``--from``-th and the ``--to``-th run finishing, so start-up (imports,
migrations) and the tail are left out. Prints one JSON line; run it several times, interleaved with
the build it is compared with, and read the medians (the machine is shared: see bench/README.md).

    .venv/bin/python bench/steady_cpu.py [--runs 2000] [--from 300] [--to 1700] [--slots 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ql3_bench as bench


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000, help="runs enqueued before the server starts")
    parser.add_argument("--from", dest="lo", type=int, default=300, help="the window opens at this many done")
    parser.add_argument("--to", dest="hi", type=int, default=1700, help="and closes at this many done")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kind", default="sqlite", choices=("sqlite", "postgres"))
    args = parser.parse_args()
    if not 0 <= args.lo < args.hi <= args.runs:
        parser.error("need 0 <= --from < --to <= --runs")
    with tempfile.TemporaryDirectory() as tmp:
        store = bench.Store(args.kind, Path(tmp) / "home")
        serve = None
        try:
            store.enqueue(args.runs)
            serve = bench.InstrumentedServe(store, args.slots)
            marks: dict[str, tuple[int, float, tuple[int, int]]] = {}
            deadline = time.monotonic() + bench.PHASE_TIMEOUT_S
            while len(marks) < 2:
                if time.monotonic() > deadline or serve.proc.poll() is not None:
                    raise RuntimeError(f"the window was not reached: {serve.log_tail()}")
                done = store.terminal()
                for name, at in (("lo", args.lo), ("hi", args.hi)):
                    if name not in marks and done >= at:
                        marks[name] = (done, time.perf_counter(), bench.cpu_ticks(serve.proc.pid))
                time.sleep(0.01)
            (d0, t0, c0), (d1, t1, c1) = marks["lo"], marks["hi"]
            runs = d1 - d0
            print(
                json.dumps(
                    {
                        "kind": args.kind,
                        "slots": args.slots,
                        "runs_in_window": runs,
                        "runs_per_s": round(runs / (t1 - t0), 1),
                        "cpu_ms_per_run_server": round((c1[0] - c0[0]) * bench.TICK_MS / runs, 3),
                        "cpu_ms_per_run_with_children": round(
                            (c1[0] - c0[0] + c1[1] - c0[1]) * bench.TICK_MS / runs, 3
                        ),
                        "load_1m": bench.load_1m(),
                    }
                ),
                flush=True,
            )
        finally:
            if serve is not None:
                serve.stop()
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
