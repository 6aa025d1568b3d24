"""``ql3 run``: start (optionally waiting for the outcome), list, show, events, logs."""

from __future__ import annotations

import argparse
import io
import sys
from datetime import UTC, datetime
from typing import Any

from ql3.cli import approvals, output, watch
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, positive_int, project_flag, wants_json
from ql3.cli.errors import EXIT_OK, CliError, UsageError


def _when(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/runs"


def _show(run: dict[str, Any]) -> None:
    output.fields(
        [
            ("id", run["id"]),
            ("status", run["status"]),
            # why a queued run is not running yet (no_free_slot, no_matching_worker, ...)
            ("waiting", run.get("waiting_reason")),
            ("task_id", run["task_id"]),
            ("task_revision", run["task_revision"]),
            ("trigger_type", run.get("trigger_type")),
            ("priority", run.get("priority")),
            ("created", _when(run.get("created_at_ms"))),
            ("started", _when(run.get("started_at_ms"))),
            ("finished", _when(run.get("finished_at_ms"))),
        ]
        # The outcome of the run's last attempt, when it has one.
        + [
            (key, run[key])
            for key in ("exit_code", "error_code", "cancel_reason")
            if run.get(key) is not None
        ]
    )


def cmd_start(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"priority": args.priority}
    if args.idempotency_key is not None:
        body["idempotency_key"] = args.idempotency_key
    timeout_s = _timeout_wait(args.timeout_wait)
    waiting = args.wait or args.follow
    if timeout_s is not None and not waiting:
        raise UsageError("--timeout-wait needs --wait or --follow")
    with ApiClient.from_environment() as api:
        status, run = api.call(
            "POST", f"/projects/{seg(args.project)}/tasks/{seg(args.task)}/runs", json=body
        )
        if status == 202:  # approval required: a request, no run yet (exit 0, also with --wait)
            return approvals.print_requested(args, run)
        verb = "started" if status == 201 else "already exists"
        if not waiting:
            if wants_json(args):
                output.emit_json(run)
            else:
                output.line(f"run {run['id']} {verb}: {run['status']}")
            return EXIT_OK
        # While waiting, stdout carries only the log (--follow) and the final result.
        if not wants_json(args):
            output.note(f"run {run['id']} {verb}: {run['status']}")
        poller = watch.Poller(timeout_s=timeout_s)
        if args.follow:
            _follow(api, args, str(run["id"]), poller)
        run = watch.wait_for_run(api, args.project, run, poller)
    if wants_json(args):
        output.emit_json(run)
    else:
        _outcome(run)
    return watch.outcome_exit(run)


def _timeout_wait(value: float | None) -> float | None:
    if value is None:
        return None
    if value != value or value <= 0 or value > 10**9:  # NaN or out of range
        raise UsageError("--timeout-wait must be a positive number of seconds")
    return float(value)


def _follow(api: ApiClient, args: argparse.Namespace, run_id: str, poller: watch.Poller) -> None:
    """Stream the log while the run goes on; with --json it goes to stderr (stdout is the run)."""
    out = sys.stderr if wants_json(args) else sys.stdout
    try:
        watch.print_log(api, args.project, run_id, follow=True, poller=poller, out=out)
    except CliError as exc:
        if exc.code != "logs_unavailable":
            raise
        output.note("the log is not available from this server; waiting for the outcome")


def _outcome(run: dict[str, Any]) -> None:
    detail = [f"{k} {run[k]}" for k in ("exit_code", "error_code") if run.get(k) is not None]
    output.note(f"run {run['id']} {run['status']}" + (f" ({', '.join(detail)})" if detail else ""))


def cmd_list(args: argparse.Namespace) -> int:
    params = {"task": args.task, "cursor": args.cursor, "limit": args.limit}
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args), params=params)
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    output.table(
        ("ID", "TASK", "REV", "STATUS", "CREATED", "EXIT"),
        [
            (
                r["id"],
                r["task_id"],
                r["task_revision"],
                r["status"],
                _when(r["created_at_ms"]),
                r.get("exit_code"),
            )
            for r in page["items"]
        ],
    )
    if page.get("next_cursor"):
        output.note(f"more: ql3 run list --cursor {page['next_cursor']}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, run = api.call("GET", f"{_base(args)}/{seg(args.run)}")
    if wants_json(args):
        output.emit_json(run)
    else:
        _show(run)
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call(
            "GET", f"{_base(args)}/{seg(args.run)}/events", params={"after": args.after, "limit": args.limit}
        )
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    output.table(
        ("SEQ", "TIME", "TYPE", "ACTOR", "PAYLOAD"),
        [
            (
                e["sequence"],
                _when(e["created_at_ms"]),
                e["type"],
                e["actor_type"],
                " ".join(f"{k}={v}" for k, v in sorted(e.get("payload", {}).items())),
            )
            for e in page["items"]
        ],
    )
    if page.get("next_after") is not None:
        output.note(f"more: ql3 run events {args.run} --after {page['next_after']}")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    text = io.StringIO() if wants_json(args) else None
    with ApiClient.from_environment() as api:
        last = watch.print_log(
            api, args.project, args.run, attempt=args.attempt, follow=args.follow, out=text
        )
    if text is not None:
        output.emit_json({"run_id": args.run, **last, "data": text.getvalue()})
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("run", help="start and inspect runs", description="Runs.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()

    start = add_command(
        actions,
        "start",
        cmd_start,
        "queue a run of a task's current revision",
        proj,
        epilog=watch.EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    start.add_argument("task", metavar="TASK", help="task name or id")
    start.add_argument("--idempotency-key", metavar="K", help="repeating a key returns the same run")
    start.add_argument("--priority", type=int, default=0, metavar="P", help="higher runs first (default 0)")
    start.add_argument(
        "--wait",
        action="store_true",
        help="wait until the run ends and exit with its outcome (see below); --json prints the final run",
    )
    start.add_argument(
        "--follow",
        action="store_true",
        help="like --wait, and stream the run's log to stdout while it is written (stderr with --json)",
    )
    start.add_argument(
        "--timeout-wait",
        type=float,
        default=None,
        metavar="S",
        help="stop waiting after S seconds with exit status 5 (default: wait as long as the run takes)",
    )

    lst = add_command(actions, "list", cmd_list, "list runs, newest first (one page)", proj)
    lst.add_argument("--task", metavar="T", help="only runs of this task (name or id)")
    lst.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    lst.add_argument("--limit", type=positive_int, default=50, metavar="N", help="page size, at most 100")

    show = add_command(actions, "show", cmd_show, "show one run", proj)
    show.add_argument("run", metavar="RUN", help="run id")

    logs = add_command(actions, "logs", cmd_logs, "print the output of the run's latest attempt", proj)
    logs.add_argument("run", metavar="RUN", help="run id")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new output until the run has ended"
    )
    logs.add_argument("--attempt", type=positive_int, default=None, metavar="N", help="attempt N instead")

    events = add_command(actions, "events", cmd_events, "the run's event log", proj)
    events.add_argument("run", metavar="RUN", help="run id")
    events.add_argument("--after", type=int, default=0, metavar="N", help="events after this sequence")
    events.add_argument("--limit", type=positive_int, default=100, metavar="N", help="page size, at most 500")
