"""The cost of one launch alone: ``LocalLauncher.start`` of a shell command, its exit through an
``ExitWatcher``, the receipt read and deleted, one launch at a time. Prints one JSON line: the CPU per
launch of the children (the shim, ``sh -c`` and the command, reaped by the shim and then by us) and of
this process, measured after ``--warmup`` launches.

    .venv/bin/python bench/launch_cost.py [--runs 200] [--warmup 20] [--command 'date +%s%N > marks']

System calls per launch: run it under ``strace -f -c`` twice with different ``--runs`` and divide the
difference of the counts by the difference of the runs (start-up cancels out), e.g. 50 and 150 with
``--warmup 0``. Compare builds by running another tree's ``src/`` with ``PYTHONPATH``, interleaved.
"""

from __future__ import annotations

import argparse
import json
import resource
import secrets
import tempfile
import threading
from pathlib import Path

from ql3.execution.launcher import ExitWatcher, LocalLauncher
from ql3.execution.receipts import delete_receipt, read_receipt, token_digest
from ql3.ports.execution import LaunchRequest, ShellCommand

RUN_ID = "run-launch-cost"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--command", default="date +%s%N > marks", help="run in a temp directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ql3-launch-cost-"))
    receipts = root / "receipts"
    token = secrets.token_urlsafe(32)
    exited = threading.Event()
    watcher = ExitWatcher(lambda attempt_id: exited.set())
    launcher = LocalLauncher()
    watcher.start()

    def launch(attempt_id: str) -> None:
        exited.clear()
        request = LaunchRequest(
            run_id=RUN_ID,
            attempt_id=attempt_id,
            command=ShellCommand(command=args.command),
            working_directory=str(root),
            environment_policy="isolated",
            environment={},
            callback_token=token,
            callback_sequence=1,
            log_path=root / "logs" / f"{attempt_id}.log",
            receipt_dir=receipts,
            log_cap_bytes=1 << 20,
            started_at_ms=1_800_000_000_000,
        )
        watcher.watch(launcher.start(request))
        if not exited.wait(30):
            raise SystemExit(f"{attempt_id}: the shim did not exit in 30 s")
        receipt = read_receipt(
            receipts,
            attempt_id,
            expected_run_id=RUN_ID,
            expected_sequence=1,
            expected_token_digest=token_digest(token),
        )
        if receipt is None:
            raise SystemExit(f"{attempt_id}: no receipt")
        delete_receipt(receipts, attempt_id)

    try:
        for n in range(args.warmup):
            launch(f"warm-{n}")
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        for n in range(args.runs):
            launch(f"att-{n}")
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        watcher.stop()

    def per_launch_ms(before: resource.struct_rusage, after: resource.struct_rusage) -> float:
        used = float(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        runs: int = max(1, args.runs)
        return round(used / runs * 1000, 3)

    print(
        json.dumps(
            {
                "runs": args.runs,
                "command": args.command,
                "children_cpu_ms_per_launch": per_launch_ms(children0, children1),
                "self_cpu_ms_per_launch": per_launch_ms(self0, self1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
