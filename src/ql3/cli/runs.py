"""``ql3 run``: start (optionally waiting for the outcome), list, show, events, logs."""

from __future__ import annotations

import argparse
import io
import sys
from datetime import UTC, datetime
from typing import Any

from ql3.application import run_queries
from ql3.cli import approvals, human, output, refs, watch
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    duration_s,
    next_page_hint,
    positive_int,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
    wants_utc,
)
from ql3.cli.errors import EXIT_OK, CliError, UsageError
from ql3.domain.durations import parse_duration_ms
from ql3.domain.errors import ValidationFailed

INTERRUPTED = 130


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/runs"


def _show(run: dict[str, Any], task_name: str, utc: bool) -> None:
    output.fields(
        [
            ("id", run["id"]),
            ("status", run["status"]),
            *([("waiting", watch.waiting_text(run))] if watch.waiting_text(run) else []),
            ("task", task_name),
            ("task_id", run["task_id"]),
            ("task_revision", run["task_revision"]),
            ("trigger", run.get("trigger") or run.get("trigger_type")),
            *([("attempt", run["attempt"])] if run.get("attempt") is not None else []),
            ("priority", run.get("priority")),
            ("created", human.when(run.get("created_at_ms"), utc)),
            ("started", human.when(run.get("started_at_ms"), utc)),
            ("finished", human.when(run.get("finished_at_ms"), utc)),
            ("duration", human.run_duration(run)),
        ]
        # The outcome of the run's last attempt, when it has one.
        + [
            (key, run[key])
            for key in ("exit_code", "error_code", "cancel_reason")
            if run.get(key) is not None
        ]
        # What the dispatcher said while it could not place the run (docs/dispatch.md).
        + [("dispatcher saw", line) for line in watch.dispatch_reason_lines(run, utc)]
    )


def cmd_start(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"priority": args.priority}
    if args.idempotency_key is not None:
        body["idempotency_key"] = args.idempotency_key
    timeout_s = _timeout_wait(args.timeout_wait)
    waiting = args.wait or args.follow
    if args.follow and wants_quiet(args):
        raise UsageError("-q prints only the run id; --follow prints the log: give one of them")
    if timeout_s is not None and not waiting:
        raise UsageError("--timeout-wait needs --wait or --follow")
    with ApiClient.from_environment() as api:
        status, run = api.call(
            "POST", f"/projects/{seg(args.project)}/tasks/{seg(args.task)}/runs", json=body
        )
        if status == 202:  # approval required: a request, no run yet (exit 0, also with --wait)
            return approvals.print_requested(args, run)
        verb = "started" if status == 201 else "already exists"
        if print_quiet_id(args, run["id"]) and not waiting:
            return EXIT_OK
        if not waiting:
            if wants_json(args):
                output.emit_json(run)
            else:
                output.line(f"run {run['id']} {verb}: {run['status']}")
            return EXIT_OK
        # While waiting, stdout carries only the log (--follow) and the final result.
        if not wants_json(args) and not wants_quiet(args):
            output.note(f"run {run['id']} {verb}: {run['status']}")
        poller = watch.Poller(timeout_s=timeout_s)
        try:
            run = watch.wait_while_queued(
                api, args.project, run, poller, None if wants_json(args) or wants_quiet(args) else output.note
            )
            if args.follow:
                _follow(api, args, str(run["id"]), poller)
            run = watch.wait_for_run(api, args.project, run, poller)
        except KeyboardInterrupt:
            return detached(str(run["id"]), args.project)
    if wants_json(args):
        output.emit_json(run)
    elif not wants_quiet(args):  # -q printed the id when the run was created; the exit status tells the rest
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


def detached(run_id: str, project: str) -> int:
    """Ctrl-C while waiting or following: only the CLI stops; say so, and how to stop the run too."""
    where = "" if project == "default" else f" --project {project}"
    short = run_id[: human.SHORT_ID]
    output.note(
        f"\ninterrupted: run {short} goes on on the server."
        f"\n  follow it again:  ql3 run logs {short} --follow{where}"
        f"\n  cancel it:        ql3 run cancel {short}{where}"
    )
    return INTERRUPTED


def _outcome(run: dict[str, Any]) -> None:
    detail = [f"{k} {run[k]}" for k in ("exit_code", "error_code") if run.get(k) is not None]
    output.note(f"run {run['id']} {run['status']}" + (f" ({', '.join(detail)})" if detail else ""))


def _moment(text: str) -> int:
    """``24h`` / ``30m`` / ``1h30m`` / ``7d`` ago, an ISO 8601 time (UTC unless it has an offset) or
    epoch ms."""
    if text.strip().isdigit():  # epoch ms, as the "more:" hint prints it
        return int(text.strip())
    if text.strip()[-1:].isalpha():
        try:
            ago_ms = parse_duration_ms(text)
        except ValidationFailed:
            pass  # an ISO 8601 time ends in a letter too ("Z")
        else:
            return max(0, int(datetime.now(tz=UTC).timestamp() * 1000) - ago_ms)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration ago (24h, 30m, 1h30m, 7d) or an ISO 8601 time: {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0, int(moment.timestamp() * 1000))


def _statuses(text: str) -> str:
    parts = [p.strip() for p in text.split(",")]
    unknown = [p for p in parts if p not in run_queries.RUN_STATUSES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown status {unknown[0]!r} (one of {', '.join(run_queries.RUN_STATUSES)})"
        )
    return ",".join(parts)


def cmd_list(args: argparse.Namespace) -> int:
    filters = {
        "task": args.task,
        "status": args.status,
        "trigger": args.trigger,
        "since": args.since,
        "until": args.until,
    }
    params = {**filters, "cursor": args.cursor, "limit": args.limit}
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args), params=params)
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    print_runs(args, page)
    return EXIT_OK


def print_runs(args: argparse.Namespace, page: dict[str, Any]) -> None:
    """A page of runs as a table of short ids and task names, or only ids with ``-q``."""
    items: list[dict[str, Any]] = page["items"]
    if wants_quiet(args):
        output.ids_only(str(r["id"]) for r in items)
        if page.get("next_cursor"):
            output.note(next_page_hint("run list", args.parser, args, cursor=str(page["next_cursor"])))
        return
    utc = wants_utc(args)
    short = human.short_ids(str(r["id"]) for r in items)
    with ApiClient.from_environment() as api:
        names = refs.TaskNames(api, args.project)
        rows = [
            (
                short[str(r["id"])],
                names.name(str(r["task_id"]), r.get("task_name")),
                r["task_revision"],
                r["status"],
                r.get("trigger") or r.get("trigger_type"),
                human.when(r["created_at_ms"], utc, label=False),
                human.run_duration(r),
                r.get("exit_code"),
            )
            for r in items
        ]
    output.table(
        (
            "ID",
            "TASK",
            "REV",
            "STATUS",
            "TRIGGER",
            f"CREATED ({human.zone_label(utc)})",
            "DURATION",
            "EXIT",
        ),
        rows,
        status_column=3,
        elastic=(1,),
    )
    if page.get("next_cursor"):
        output.note(next_page_hint("run list", args.parser, args, cursor=str(page["next_cursor"])))


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, run = api.call("GET", f"{_base(args)}/{seg(args.run)}")
        if wants_json(args):
            output.emit_json(run)
        else:
            name = refs.TaskNames(api, args.project).name(str(run["task_id"]), run.get("task_name"))
            _show(run, name, wants_utc(args))
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
        ("SEQ", f"TIME ({human.zone_label(wants_utc(args))})", "TYPE", "ACTOR", "PAYLOAD"),
        [
            (
                e["sequence"],
                human.when(e["created_at_ms"], wants_utc(args), label=False),
                e["type"],
                e["actor_type"],
                " ".join(f"{k}={v}" for k, v in sorted(e.get("payload", {}).items())),
            )
            for e in page["items"]
        ],
        elastic=(4,),
    )
    if page.get("next_after") is not None:
        output.note(f"more: ql3 run events {args.run} --after {page['next_after']}")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    text = io.StringIO() if wants_json(args) else None
    with ApiClient.from_environment() as api:
        try:
            last = watch.print_log(
                api, args.project, args.run, attempt=args.attempt, follow=args.follow, out=text
            )
        except KeyboardInterrupt:
            if not args.follow:
                raise
            return detached(args.run, args.project)
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
    quiet_flag(start)
    start.set_defaults(refs={"task": "task"})
    start.add_argument(
        "--idempotency-key",
        metavar="K",
        help="repeating a key with the same options returns the same run (with other options: a"
        " conflict); keys starting with ql3: are reserved",
    )
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
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="stop waiting after DURATION (30, 2m, 1h30m) with exit status 5 (default: as long as it takes)",
    )

    lst = add_command(actions, "list", cmd_list, "list runs, newest first (one page)", proj)
    lst.set_defaults(refs={"task": "task"})
    quiet_flag(lst)
    lst.add_argument("--task", metavar="T", help="only runs of this task (name or id)")
    lst.add_argument(
        "--status", type=_statuses, metavar="S[,S]", help="only these statuses, e.g. failed,timed_out"
    )
    lst.add_argument(
        "--trigger", choices=run_queries.TRIGGERS, help="only runs started this way (retry: a re-run)"
    )
    lst.add_argument(
        "--since", type=_moment, metavar="WHEN", help="created at or after: 24h, 30m, 7d ago or ISO 8601"
    )
    lst.add_argument("--until", type=_moment, metavar="WHEN", help="created before (same forms)")
    lst.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    lst.add_argument("--limit", type=positive_int, default=50, metavar="N", help="page size, at most 100")

    show = add_command(actions, "show", cmd_show, "show one run", proj)
    show.add_argument("run", metavar="RUN", help="run id or a unique prefix of one")
    show.set_defaults(refs={"run": "run"})

    logs = add_command(actions, "logs", cmd_logs, "print the output of the run's latest attempt", proj)
    logs.add_argument("run", metavar="RUN", help="run id or a unique prefix of one")
    logs.set_defaults(refs={"run": "run"})
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new output until the run has ended"
    )
    logs.add_argument("--attempt", type=positive_int, default=None, metavar="N", help="attempt N instead")

    events = add_command(actions, "events", cmd_events, "the run's event log", proj)
    events.add_argument("run", metavar="RUN", help="run id or a unique prefix of one")
    events.set_defaults(refs={"run": "run"})
    events.add_argument("--after", type=int, default=0, metavar="N", help="events after this sequence")
    events.add_argument("--limit", type=positive_int, default=100, metavar="N", help="page size, at most 500")
