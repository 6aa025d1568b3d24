"""``ql3 token create``."""

from __future__ import annotations

import argparse

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, wants_json
from ql3.cli.errors import EXIT_OK


def cmd_create(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, issued = api.call(
            "POST", f"/projects/{seg(args.project)}/tokens", json={"role": args.role, "name": args.name}
        )
    if wants_json(args):
        output.emit_json(issued)
    else:
        output.note(
            f"token for {issued['name']} ({issued['role']} in project {issued['project']});"
            " it is shown only this once"
        )
        output.line(issued["token"])
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("token", help="API tokens", description="API tokens.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = add_command(
        actions, "create", cmd_create, "create a principal and print its token once", project_flag()
    )
    create.add_argument("--role", required=True, choices=("viewer", "operator", "approver", "admin"))
    create.add_argument("--name", default="token", metavar="N", help="a label for the principal")
