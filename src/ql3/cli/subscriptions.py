"""``ql3 subscription``: add, list, sync, log, rm (docs/scripts.md "Subscriptions")."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import httpx

from ql3.cli import output, watch
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, quiet_flag, wants_json, wants_quiet
from ql3.cli.errors import EXIT_ERROR, EXIT_OK, CliError, UsageError
from ql3.cli.notify import _error_of
from ql3.domain import cronexplain

MAX_SECRET_FILE_BYTES = 16384
_NAME_HELP = "subscription name or a unique prefix of its id"
SYNC_RUN_TIMEOUT_S = 300.0  # the control plane answers within its fetch timeout (120 s) and the apply
SYNC_RUN_RETRY_S = 15.0  # a run starts before its credential is accepted: 409 attempt_not_running


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/subscriptions"


def _secret_file(name: str, flag: str) -> str:
    """A credential read from a file (never from the command line, where ps shows it)."""
    try:
        with open(name, "rb") as src:
            raw = src.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {name}: {exc.strerror}") from None
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise UsageError(f"{flag}: {name} is larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{flag}: {name} is not text") from None


def cmd_add(args: argparse.Namespace) -> int:
    if args.cron is not None:
        reason = cronexplain.explain(args.cron)
        if reason is not None:
            raise UsageError(f"--cron {args.cron!r}: {reason}", code="validation_failed")
    if args.deploy_key is not None and args.token_file is not None:
        raise UsageError("give --deploy-key or --token-file, not both")
    body: dict[str, Any] = {"name": args.name, "repo": args.repo}
    for key in ("branch", "path", "cron"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.deploy_key is not None:
        body["deploy_key"] = _secret_file(args.deploy_key, "--deploy-key")
    if args.token_file is not None:
        body["token"] = _secret_file(args.token_file, "--token-file").strip()
    with ApiClient.from_environment() as api:
        _, sub = api.call("POST", _base(args), json=body)
        if args.sync:
            return _sync(api, args, sub["name"], quiet_header=wants_json(args))
    if wants_json(args):
        output.emit_json(sub)
    else:
        output.line(f"subscription {sub['name']} added: sync it with ql3 subscription sync {sub['name']}")
    return EXIT_OK


def _sync(api: ApiClient, args: argparse.Namespace, name: str, *, quiet_header: bool = False) -> int:
    """Queue a sync run, stream its log (git's output and what changed) and exit with its outcome."""
    _, started = api.call("POST", f"{_base(args)}/{seg(name)}/syncs")
    run_id = started["run_id"]
    output.note(f"sync run {run_id} of task {started['task']} queued")
    poller = watch.Poller()
    run: dict[str, Any] = {"id": run_id, "status": "queued"}
    run = watch.wait_while_queued(api, args.project, run, poller, output.note)
    out = sys.stderr if wants_json(args) else sys.stdout
    try:
        watch.print_log(api, args.project, run_id, follow=True, poller=poller, out=out)
    except CliError as exc:
        if exc.code != "logs_unavailable":
            raise
    run = watch.wait_for_run(api, args.project, run, poller)
    if wants_json(args):
        output.emit_json(run)
    if run["status"] == "succeeded":
        return EXIT_OK
    output.note(f"sync failed: run {run_id} {run['status']} (ql3 run logs {run_id})")
    return EXIT_ERROR


def cmd_sync(args: argparse.Namespace) -> int:
    """Sync now: print git's output and what changed; exit 1 when the sync failed (it changed nothing)."""
    with ApiClient.from_environment() as api:
        return _sync(api, args, args.name)


def cmd_sync_run(args: argparse.Namespace) -> int:
    """The command of a sync run (task ql3-sync-NAME): asks the control plane, with the run's own
    credential, to sync, then prints the sync's log; exit 1 when the sync failed."""
    url, token = os.environ.get("QL3_NOTIFY_URL"), os.environ.get("QL3_NOTIFY_TOKEN")
    if not url or not token:
        raise UsageError(
            "QL3_NOTIFY_URL and QL3_NOTIFY_TOKEN are set only inside a ql3 run", code="not_in_a_run"
        )
    deadline = time.monotonic() + SYNC_RUN_RETRY_S
    delay = 0.1
    with httpx.Client(timeout=SYNC_RUN_TIMEOUT_S) as client:
        while True:
            try:
                answer = client.post(
                    url.rstrip("/") + "/api/v1/subscription-sync",
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.HTTPError as exc:
                raise CliError("unreachable", f"{url}: {type(exc).__name__}", EXIT_ERROR) from None
            if answer.is_success:
                break
            error = _error_of(answer)
            if error[0] != "attempt_not_running" or time.monotonic() >= deadline:
                raise CliError(error[0], error[1], EXIT_ERROR)
            time.sleep(delay)
            delay = min(1.0, delay * 2)
    done = answer.json()
    sys.stdout.write(done["log"])
    sys.stdout.write(f"sync {done['status']}: {done['summary'] or ''}\n")
    sys.stdout.flush()
    return EXIT_OK if done["status"] == "succeeded" else EXIT_ERROR


def _row(sub: dict[str, Any]) -> tuple[object, ...]:
    dash = "-"
    return (
        sub["name"],
        sub["repo"],
        sub["branch"] or dash,
        sub["path"] or dash,
        sub["cron"] or dash,
        sub["has_credential"],
    )


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args))
    if wants_json(args):
        output.emit_json(page)
    elif wants_quiet(args):
        output.ids_only(str(s["name"]) for s in page["items"])
    else:
        output.table(
            ("NAME", "REPO", "BRANCH", "PATH", "CRON", "KEY"),
            [
                (
                    s["name"],
                    s["repo"],
                    s["branch"] or "-",
                    s["path"] or "-",
                    s["cron"] or "-",
                    s["has_credential"],
                )
                for s in page["items"]
            ],
        )
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    """The latest sync's log (``--all``: every kept sync, newest first)."""
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"{_base(args)}/{seg(args.name)}/syncs")
    items = page["items"] if args.all else page["items"][:1]
    if wants_json(args):
        output.emit_json({"items": items})
        return EXIT_OK
    if not items:
        output.note(f"subscription {args.name} has not synced yet")
    for item in items:
        run = f", run {item['run_id']}" if item.get("run_id") else ""
        summary = item["summary"] or ""
        output.line(f"== sync {item['id']} ({item['trigger']}{run}): {item['status']} {summary}")
        sys.stdout.write(item["log"])
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        api.call("DELETE", f"{_base(args)}/{seg(args.name)}")
    output.line(f"subscription {args.name} removed (its scripts and tasks stay)")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "subscription",
        help="git repositories synced into the project's scripts",
        description="Subscriptions: a git repository synced into the project's scripts; scripts with a "
        "'cron:' header line become tasks.",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()
    add = add_command(actions, "add", cmd_add, "subscribe to a git repository", proj)
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--repo", required=True, metavar="URL", help="https://, ssh://, file:// or user@host:path"
    )
    add.add_argument("--branch", metavar="B", help="default: the repository's default branch")
    add.add_argument(
        "--path", metavar="GLOB", help="the files to take (default: *.py *.js *.mjs *.cjs *.sh *.ts)"
    )
    add.add_argument("--cron", metavar="EXPR", help="sync on this schedule (five fields, UTC)")
    add.add_argument(
        "--deploy-key", metavar="FILE", help="SSH private key of a private repository (encrypted at rest)"
    )
    add.add_argument("--token-file", metavar="FILE", help="file holding an HTTPS token (encrypted at rest)")
    add.add_argument("--sync", action="store_true", help="sync once right away")
    quiet_flag(add_command(actions, "list", cmd_list, "the project's subscriptions", proj))
    sync = add_command(actions, "sync", cmd_sync, "sync now and print git's output", proj)
    sync.add_argument("name", metavar="NAME", help=_NAME_HELP)
    sync.set_defaults(refs={"name": "subscription"})
    sync_run = add_command(
        actions, "sync-run", cmd_sync_run, "the command of a sync run (task ql3-sync-NAME), inside it", proj
    )
    sync_run.add_argument("name", metavar="NAME")
    log = add_command(actions, "log", cmd_log, "the latest sync's output", proj)
    log.add_argument("name", metavar="NAME", help=_NAME_HELP)
    log.set_defaults(refs={"name": "subscription"})
    log.add_argument("--all", action="store_true", help="every kept sync, newest first")
    rm = add_command(actions, "rm", cmd_rm, "remove a subscription (its scripts and tasks stay)", proj)
    rm.add_argument("name", metavar="NAME", help=_NAME_HELP)
    rm.set_defaults(refs={"name": "subscription"})
