"""``ql3 whoami``: the principal behind the token in use and its role in each project."""

from __future__ import annotations

import argparse

from ql3.cli import output
from ql3.cli.client import ApiClient
from ql3.cli.common import Subparsers, add_command, wants_json
from ql3.cli.errors import EXIT_OK


def cmd_whoami(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, me = api.call("GET", "/whoami")
    if wants_json(args):
        output.emit_json(me)
        return EXIT_OK
    owner = " (owner: admin in every project)" if me["is_owner"] else ""
    output.fields(
        [("name", me["name"] + owner), ("id", me["principal_id"]), ("kind", me["kind"])]
        + [(f"role in {project}", role) for project, role in sorted(me["roles"].items())]
    )
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    add_command(subparsers, "whoami", cmd_whoami, "show the principal of the token in use and its roles")
