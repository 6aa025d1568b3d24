"""``ql3 project``: list, create."""

from __future__ import annotations

import argparse

from ql3.cli import output
from ql3.cli.client import ApiClient
from ql3.cli.common import Parser, Subparsers, add_command, quiet_flag, wants_json, wants_quiet
from ql3.cli.errors import EXIT_OK


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
    else:
        output.line(f"project {project['name']} created: id {project['id']}")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("project", help="projects", description="Projects.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    quiet_flag(add_command(actions, "list", cmd_list, "projects you hold a role in"))
    create = add_command(actions, "create", cmd_create, "create a project (owner only)")
    create.add_argument("name", metavar="NAME")
