"""``ql3 task``: add, list, show, edit, enable, disable, rm."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from ql3.cli import human, output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    duration_ms,
    key_values,
    next_page_hint,
    positive_int,
    preferences,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
    wants_utc,
)
from ql3.cli.errors import EXIT_OK, UsageError
from ql3.domain import cronexplain, timezones

TASK_COLUMNS = ("NAME", "ID", "REV", "ENABLED", "CRON", "OVERLAP")


def _cron_duration_ms(text: str, what: str) -> int:
    """A cron setting's duration (``90s``, ``5m``, ``1h``, ``250ms``, bare seconds; ``--random-delay``
    also takes ``0-300s``), at most an hour."""
    spec = text.strip()
    if what == "--random-delay" and spec.startswith("0-"):
        spec = spec[2:]
    value = duration_ms(spec, what)
    if value > 3_600_000:
        raise UsageError(f"{what} {text!r}: at most 1h")
    return value


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/tasks"


DEFAULT_CWD_TEXT = "the server's scripts directory (default $QL3_HOME/scripts)"


def _show(task: dict[str, Any], as_json: bool, utc: bool = False) -> None:
    if as_json:
        output.emit_json(task)
        return
    digest = task.get("content_digest")
    output.fields(
        [
            ("name", task["name"]),
            ("id", task["id"]),
            ("revision", task["revision"]),
            ("enabled", task["enabled"]),
            ("cron", _cron_text(task)),
            ("next_fire", _fire_text(task, task.get("next_fire_at_ms"), utc)),
            *[("then", _fire_text(task, ms, utc)) for ms in task.get("next_fires_at_ms", [])[1:]],
            ("overlap", task.get("overlap")),
            ("misfire", task.get("misfire")),
            ("misfire_grace", human.duration(task.get("misfire_grace_ms"))),
            (
                "random_delay",
                human.duration(task.get("random_delay_ms")) if task.get("random_delay_ms") else None,
            ),
            ("on_start", True if task.get("on_start") else None),
            ("approval", task.get("approval")),
            ("timeout", human.duration(task.get("timeout_ms"))),
            ("grace", human.duration(task.get("grace_ms"))),
            ("max_attempts", task.get("max_attempts")),
            ("working_dir", "its own (not shown)" if task.get("has_cwd") else DEFAULT_CWD_TEXT),
            ("env_keys", ",".join(task.get("env_keys", [])) or None),
            ("require", ",".join(f"{k}={v}" for k, v in task.get("require", {}).items()) or None),
            ("content_digest", f"{digest[:12]}…" if isinstance(digest, str) else None),
        ],
        status_key=None,
    )
    skipped = task.get("skipped_occurrences") or []
    if skipped:
        output.line("skipped occurrences (newest first):")
        for skip in skipped:
            output.line(f"  {_skip_text(skip, utc)}")


def _skip_text(skip: dict[str, Any], utc: bool) -> str:
    first, last, n = skip["occurrence_ms"], skip["last_occurrence_ms"], skip["occurrences"]
    span = human.when(first, utc) if n == 1 else f"{human.when(first, utc)} .. {human.when(last, utc)} ({n})"
    return f"{span}  {skip['reason']}"


def _cron_text(task: dict[str, Any]) -> str | None:
    """The fields and the zone they are read in: ``0 8 * * * (Asia/Shanghai)``."""
    cron = task.get("cron")
    if not cron:
        return None
    return f"{timezones.split_cron(cron)[1]} ({task.get('tz') or timezones.DEFAULT_ZONE})"


def _fire_text(task: dict[str, Any], ms: object, utc: bool) -> str | None:
    """A fire time in the viewer's zone (or UTC), and in the task's zone when that differs."""
    if not isinstance(ms, int):
        return None
    shown = human.when(ms, utc)
    zone_name = str(task.get("tz") or timezones.DEFAULT_ZONE)
    own = datetime.fromtimestamp(ms / 1000, tz=timezones.zone(zone_name)).strftime(human.TIME_FORMAT)
    if own == human.when(ms, utc, label=False):
        return shown
    return f"{shown} ({own} {zone_name})"


def _spec_options(parser: Parser, *, editing: bool) -> None:
    parser.add_argument(
        "--cron",
        metavar="EXPR",
        help="cron expression: minute hour day month weekday, or six fields with seconds first (at"
        " most every 10 s); read in --tz, a CRON_TZ=ZONE prefix or the project's zone (else UTC)",
    )
    parser.add_argument(
        "--tz",
        metavar="ZONE",
        help="IANA time zone the cron is read in, e.g. Asia/Shanghai"
        + ("; moves the current schedule too" if editing else " (default: the project's zone, else UTC)"),
    )
    parser.add_argument(
        "--cwd", metavar="DIR", help=f"absolute working directory (default: {DEFAULT_CWD_TEXT})"
    )
    parser.add_argument(
        "--env",
        action="append",
        metavar="K=V",
        help="environment variable (repeatable)" + ("; replaces the whole mapping" if editing else ""),
    )
    parser.add_argument(
        "--script", metavar="PATH", help="run this project script (ql3 script list); the file is $QL3_SCRIPT"
    )
    parser.add_argument("--timeout", metavar="DURATION", help="timeout: seconds or 90s, 10m, 1h30m")
    parser.add_argument("--grace", metavar="DURATION", help="time between TERM and KILL (default 5s)")
    parser.add_argument(
        "--require",
        action="append",
        metavar="k=v",
        help="worker label required for placement (repeatable)" + ("; replaces all" if editing else ""),
    )
    parser.add_argument(
        "--prefer",
        action="append",
        metavar="k=v[:weight]",
        help="worker label preferred for placement (repeatable)" + ("; replaces all" if editing else ""),
    )
    parser.add_argument(
        "--overlap",
        choices=("allow", "skip", "cancel_previous"),
        help="when a cron occurrence is due while an earlier run of the task is still active: start "
        "another (allow, the default), skip this occurrence, or cancel the earlier run first; it "
        "applies to cron admissions only, a manual run start always starts",
    )
    parser.add_argument(
        "--misfire",
        choices=("skip", "fire_once"),
        help="cron occurrences missed beyond the grace: skip them (each one recorded), or run the oldest"
        " one once",
    )
    parser.add_argument(
        "--misfire-grace",
        metavar="DURATION",
        help="how late a cron occurrence may still start (default 5m, at most 1h; 0: only on time)",
    )
    parser.add_argument(
        "--random-delay",
        metavar="DURATION",
        help="delay each cron occurrence by a random 0..DURATION (e.g. 0-300s; at most 1h), seeded by task"
        " and occurrence so a restart does not re-roll it",
    )
    parser.add_argument(
        "--on-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run the task once each time the server starts (not again after a crash restart)",
    )
    parser.add_argument(
        "--approval", choices=("required", "none"), help="require an approval before each run"
    )
    parser.add_argument(
        "--max-attempts",
        type=positive_int,
        metavar="N",
        help="attempts per run when the worker is lost (above 1 needs --retry-safe)",
    )
    parser.add_argument(
        "--retry-safe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="declare that the command is safe to run again after a lost attempt (needed for retries)",
    )
    parser.add_argument(
        "--environment-policy",
        choices=("inherit", "isolated"),
        help="isolated (default for new tasks: PATH, HOME, LANG and the task's env) or inherit the"
        " server's environment",
    )


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.cron is not None:
        reason = cronexplain.explain(args.cron)
        if reason is not None:  # the server says the same; checked here to name the option
            raise UsageError(f"--cron {args.cron!r}: {reason}", code="validation_failed")
        body["cron"] = args.cron
    if args.tz is not None:
        problem = timezones.zone_problem(args.tz)
        if problem is not None:
            raise UsageError(f"--tz: {problem}", code="validation_failed")
        body["tz"] = args.tz
    if args.cwd is not None:
        body["cwd"] = args.cwd
    if args.env is not None:
        body["env"] = key_values(args.env, "--env")
    if args.timeout is not None:
        timeout_ms = duration_ms(args.timeout, "--timeout")
        if timeout_ms < 1:
            raise UsageError("--timeout must be a positive duration (90, 90s, 5m, 1h30m)")
        body["timeout_ms"] = timeout_ms
    if args.grace is not None:
        body["grace_ms"] = duration_ms(args.grace, "--grace")
    if args.misfire_grace is not None:
        body["misfire_grace_ms"] = _cron_duration_ms(args.misfire_grace, "--misfire-grace")
    if args.random_delay is not None:
        body["random_delay_ms"] = _cron_duration_ms(args.random_delay, "--random-delay")
    if args.on_start is not None:
        body["on_start"] = args.on_start
    if args.require is not None:
        body["require"] = key_values(args.require, "--require")
    if args.prefer is not None:
        body["prefer"] = preferences(args.prefer)
    if args.script is not None:
        body["script"] = args.script
    for name in ("overlap", "misfire", "approval", "max_attempts", "retry_safe", "environment_policy"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    return body


def cmd_add(args: argparse.Namespace) -> int:
    if args.command is None and args.script is None:
        raise UsageError("give --command CMD or --script PATH (or both)")
    body = {"name": args.name, **_spec(args)}
    if args.command is not None:
        body["command"] = args.command
    if body.get("max_attempts", 1) > 1 and not body.get("retry_safe"):
        raise UsageError(
            "--max-attempts above 1 needs --retry-safe: declare that the command is safe to run again",
            code="retry_safety_required",
        )
    if args.disabled:
        body["enabled"] = False
    with ApiClient.from_environment() as api:
        _, task = api.call("POST", _base(args), json=body)
    if wants_json(args):
        output.emit_json(task)
    else:
        if not print_quiet_id(args, task["id"]):
            output.line(f"task {task['name']} created: id {task['id']} revision {task['revision']}")
        for warning in task.get("warnings", []):
            output.note(f"warning: {warning}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        params = {"cursor": args.cursor, "limit": args.limit, "q": args.search}
        _, page = api.call("GET", _base(args), params=params)
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    if wants_quiet(args):
        output.ids_only(str(t["id"]) for t in page["items"])
        if page.get("next_cursor"):
            output.note(next_page_hint("task list", args.parser, args, cursor=str(page["next_cursor"])))
        return EXIT_OK
    short = human.short_ids(str(t["id"]) for t in page["items"])
    output.table(
        TASK_COLUMNS,
        [
            (t["name"], short[str(t["id"])], t["revision"], t["enabled"], t.get("cron"), t.get("overlap"))
            for t in page["items"]
        ],
        elastic=(0, 4),
    )
    if page.get("next_cursor"):
        output.note(next_page_hint("task list", args.parser, args, cursor=str(page["next_cursor"])))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, task = api.call("GET", f"{_base(args)}/{seg(args.task)}")
    _show(task, wants_json(args), wants_utc(args))
    return EXIT_OK


def cmd_edit(args: argparse.Namespace) -> int:
    body = _spec(args)
    if args.command is not None:
        body["command"] = args.command
    for flag, name in (
        ("no_cron", "cron"),
        ("no_cwd", "cwd"),
        ("no_timeout", "timeout_ms"),
        ("clear_env", "env"),
        ("clear_require", "require"),
        ("clear_prefer", "prefer"),
    ):
        if getattr(args, flag):
            if name in body:
                raise UsageError(f"--{flag.replace('_', '-')} conflicts with a new value for {name}")
            body[name] = None
    if not body:
        raise UsageError("nothing to change: give at least one option")
    with ApiClient.from_environment() as api:
        _, task = api.call("PATCH", f"{_base(args)}/{seg(args.task)}", json=body)
    if wants_json(args):
        output.emit_json(task)
    else:
        output.line(f"task {task['name']} is at revision {task['revision']}")
    return EXIT_OK


def _toggle(args: argparse.Namespace, action: str) -> int:
    with ApiClient.from_environment() as api:
        _, task = api.call("POST", f"{_base(args)}/{seg(args.task)}/{action}")
    if wants_json(args):
        output.emit_json(task)
    else:
        output.line(f"task {task['name']} {'enabled' if task['enabled'] else 'disabled'}")
    return EXIT_OK


def cmd_enable(args: argparse.Namespace) -> int:
    return _toggle(args, "enable")


def cmd_disable(args: argparse.Namespace) -> int:
    return _toggle(args, "disable")


def cmd_rm(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        api.call("DELETE", f"{_base(args)}/{seg(args.task)}")
    if wants_json(args):
        output.emit_json({"deleted": True, "task": args.task})
    else:
        output.line(f"task {args.task} deleted")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("task", help="define and manage tasks", description="Tasks.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()

    add = add_command(actions, "add", cmd_add, "define a task", proj)
    add.add_argument("name", metavar="NAME")
    quiet_flag(add)
    add.add_argument(
        "--command",
        metavar="CMD",
        help="shell command to run (with --script, default: its interpreter on $QL3_SCRIPT)",
    )
    _spec_options(add, editing=False)
    add.add_argument("--disabled", action="store_true", help="create the task disabled")

    lst = add_command(actions, "list", cmd_list, "list tasks by name", proj)
    quiet_flag(lst)
    lst.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    lst.add_argument("--limit", type=positive_int, default=200, metavar="N", help="page size, at most 200")
    lst.add_argument(
        "--search",
        metavar="TEXT",
        help="only tasks whose name contains TEXT (ASCII case ignored) or whose id starts with it",
    )

    show = add_command(
        actions, "show", cmd_show, "show one task (never env values; --json: the command for editors)", proj
    )
    show.add_argument("task", metavar="TASK", help="name or id")
    show.set_defaults(refs={"task": "task"})

    edit = add_command(actions, "edit", cmd_edit, "publish a new revision of a task", proj)
    edit.add_argument("task", metavar="TASK", help="name or id")
    edit.set_defaults(refs={"task": "task"})
    edit.add_argument("--command", metavar="CMD")
    _spec_options(edit, editing=True)
    edit.add_argument("--no-cron", action="store_true", help="remove the schedule")
    edit.add_argument("--no-cwd", action="store_true", help="run in the default directory")
    edit.add_argument("--no-timeout", action="store_true", help="remove the timeout")
    edit.add_argument("--clear-env", action="store_true", help="remove all environment variables")
    edit.add_argument("--clear-require", action="store_true", help="remove all required labels")
    edit.add_argument("--clear-prefer", action="store_true", help="remove all preferences")

    for name, handler, text in (
        ("enable", cmd_enable, "enable a task (its cron fires again)"),
        ("disable", cmd_disable, "disable a task"),
        ("rm", cmd_rm, "delete a task (its runs stay)"),
    ):
        cmd = add_command(actions, name, handler, text, proj)
        cmd.add_argument("task", metavar="TASK", help="name or id")
        cmd.set_defaults(refs={"task": "task"})
