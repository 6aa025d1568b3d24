"""``ql3 deps add|list|rm|install``: a project's Python and Node dependencies (docs/dependencies.md).

Each change queues a run of the project's ``ql3-deps`` task that installs the whole set into the
project's virtualenv and ``node_modules`` on the worker; ``--follow`` streams its log and exits with
its outcome (0 installed, 2 failed), like ``ql3 run start --follow``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ql3.cli import output, watch
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, wants_json
from ql3.cli.errors import EXIT_OK, CliError

EPILOG = """\
examples:
  ql3 deps add python requests==2.32.*     # PEP 508: name[extras] and a version specifier
  ql3 deps add node axios@^1.7 --follow    # an npm name and an optional range; stream the install
  ql3 deps list
  ql3 deps rm python requests
  ql3 deps install                         # install the current set again (a new worker, a failed run)

Tasks find the set on PATH (the virtualenv's bin, node_modules/.bin) and NODE_PATH. pip and npm read
their index settings (PIP_INDEX_URL, PIP_FIND_LINKS, npm_config_registry) from the worker's environment.
"""


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/dependencies"


def _after_change(api: ApiClient, args: argparse.Namespace, what: str, run_id: str | None) -> int:
    if run_id is None:
        if not wants_json(args):
            output.line(f"{what}: already in the set, nothing to install")
        return EXIT_OK
    where = "" if args.project == "default" else f" --project {args.project}"
    if not args.follow:
        if not wants_json(args):
            output.line(f"{what}: install run {run_id} queued (ql3 run logs {run_id} --follow{where})")
        return EXIT_OK
    output.note(f"{what}: install run {run_id} queued")
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
    else:
        output.line(f"install run {run_id}: {run['status']}")
    return watch.outcome_exit(run)


def cmd_add(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, change = api.call("POST", _base(args), json={"kind": args.kind, "spec": args.spec})
        if wants_json(args) and not args.follow:
            output.emit_json(change)
        return _after_change(api, args, f"{change['kind']} {change['spec']}", change["run_id"])


def cmd_rm(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, change = api.call("DELETE", f"{_base(args)}/{seg(args.kind)}/{seg(args.name)}")
        if wants_json(args) and not args.follow:
            output.emit_json(change)
        return _after_change(api, args, f"{change['kind']} {change['name']} removed", change["run_id"])


def cmd_install(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, started = api.call("POST", f"{_base(args)}/install")
        if wants_json(args) and not args.follow:
            output.emit_json(started)
        return _after_change(api, args, "the current set", started["run_id"])


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args))
    if wants_json(args):
        output.emit_json(page)
    else:
        output.table(("KIND", "NAME", "SPEC"), [(d["kind"], d["name"], d["spec"]) for d in page["items"]])
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "deps",
        help="a project's Python and Node dependencies",
        description="A project's Python (pip) and Node (npm) dependencies, installed by a run on the worker.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()
    follow = Parser(add_help=False)
    follow.add_argument(
        "--follow", "-f", action="store_true", help="stream the install run's log, exit with its outcome"
    )
    add = add_command(
        actions, "add", cmd_add, "add a dependency (or change its version) and install", proj, follow
    )
    add.add_argument("kind", choices=("python", "node"))
    add.add_argument("spec", metavar="SPEC", help="requests==2.32.* (PEP 508) or axios@^1.7 (npm)")
    rm = add_command(actions, "rm", cmd_rm, "remove a dependency and install the remaining set", proj, follow)
    rm.add_argument("kind", choices=("python", "node"))
    rm.add_argument("name", metavar="NAME")
    add_command(actions, "install", cmd_install, "install the current set again", proj, follow)
    add_command(actions, "list", cmd_list, "list the project's dependencies", proj)
