"""``ql3 project``: list, create, show, set (the default time zone), retention show|set."""

from __future__ import annotations

import argparse

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    positive_int,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
)
from ql3.cli.errors import EXIT_OK, UsageError
from ql3.domain import timezones


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", "/projects", params={"limit": 200})
    if wants_json(args):
        output.emit_json(page)
    elif wants_quiet(args):
        output.ids_only(str(p["id"]) for p in page["items"])
    else:
        output.table(("NAME", "ID", "ROLE"), [(p["name"], p["id"], p.get("role")) for p in page["items"]])
    return EXIT_OK


def cmd_create(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, project = api.call("POST", "/projects", json={"name": args.name})
    if wants_json(args):
        output.emit_json(project)
    elif not print_quiet_id(args, project["id"]):
        output.line(f"project {project['name']} created: id {project['id']}")
    return EXIT_OK


def _show_settings(args: argparse.Namespace, settings: dict[str, object]) -> None:
    if wants_json(args):
        output.emit_json(settings)
        return
    zone_name = settings.get("default_tz")
    output.fields([("time zone", zone_name or f"{timezones.DEFAULT_ZONE} (none set)")], status_key=None)


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, settings = api.call("GET", f"/projects/{seg(args.project)}/settings")
    _show_settings(args, settings)
    return EXIT_OK


def cmd_set(args: argparse.Namespace) -> int:
    if args.tz is None and not args.no_tz:
        raise UsageError("nothing to change: give --tz ZONE or --no-tz")
    if args.tz is not None and args.no_tz:
        raise UsageError("--tz conflicts with --no-tz")
    if args.tz is not None and (problem := timezones.zone_problem(args.tz)) is not None:
        raise UsageError(f"--tz: {problem}", code="validation_failed")
    with ApiClient.from_environment() as api:
        _, settings = api.call("PUT", f"/projects/{seg(args.project)}/settings", json={"default_tz": args.tz})
    _show_settings(args, settings)
    return EXIT_OK


def _show_policy(args: argparse.Namespace, policy: dict[str, object]) -> None:
    if wants_json(args):
        output.emit_json(policy)
        return
    output.fields(
        [
            ("keep days", policy["keep_days"] or "forever"),
            ("runs per task", policy["runs_per_task"] or "all"),
            ("log bytes per run", policy["log_bytes_per_run"] or "no cap"),
        ]
    )


def cmd_retention_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, policy = api.call("GET", f"/projects/{seg(args.project)}/retention")
    _show_policy(args, policy)
    return EXIT_OK


def cmd_retention_set(args: argparse.Namespace) -> int:
    body = {"keep_days": args.days, "runs_per_task": args.runs_per_task, "log_bytes_per_run": args.log_bytes}
    with ApiClient.from_environment() as api:
        _, policy = api.call("PUT", f"/projects/{seg(args.project)}/retention", json=body)
    _show_policy(args, policy)
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("project", help="projects", description="Projects.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    quiet_flag(add_command(actions, "list", cmd_list, "projects you hold a role in"))
    create = add_command(actions, "create", cmd_create, "create a project (owner only)")
    create.add_argument("name", metavar="NAME")
    quiet_flag(create)
    add_command(
        actions, "show", cmd_show, "show the project's settings (its default time zone)", project_flag()
    )
    setter_tz = add_command(
        actions,
        "set",
        cmd_set,
        "change the project's settings (admin)",
        project_flag(),
        epilog="example: ql3 project set --tz Asia/Shanghai  (tasks created afterwards read their cron"
        " in that zone; existing schedules keep theirs)",
    )
    setter_tz.add_argument("--tz", metavar="ZONE", help="default time zone of new cron schedules (IANA name)")
    setter_tz.add_argument("--no-tz", action="store_true", help="back to UTC for new schedules")
    retention: Parser = actions.add_parser(
        "retention",
        help="how long runs and logs are kept",
        description="Retention: terminal runs older than --days, or beyond the newest --runs-per-task of"
        " each task, are pruned with their events, attempts and log files; kept logs are cut to --log-bytes.",
    )
    policy = retention.add_subparsers(dest="retention_action", metavar="ACTION", required=True)
    add_command(policy, "show", cmd_retention_show, "show the project's retention policy", project_flag())
    setter = add_command(
        policy,
        "set",
        cmd_retention_set,
        "replace the policy (a limit not given is switched off)",
        project_flag(),
        epilog="example: ql3 project retention set --days 30 --runs-per-task 1000 --log-bytes 1048576",
    )
    setter.add_argument("--days", type=positive_int, metavar="N", help="keep runs for N days")
    setter.add_argument(
        "--runs-per-task", type=positive_int, metavar="N", help="keep the newest N runs of each task"
    )
    setter.add_argument(
        "--log-bytes", type=positive_int, metavar="B", help="cut each kept log to B bytes (>= 1024)"
    )
