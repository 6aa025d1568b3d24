"""``ql3 db migrate|status``: straight on the database, not through the API."""

from __future__ import annotations

import argparse

from ql3.bootstrap import open_database
from ql3.cli import output
from ql3.cli.common import Parser, Subparsers, add_command, wants_json
from ql3.cli.config import database_url
from ql3.cli.errors import EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    db = open_database(database_url(args.database_url))
    try:
        applied = db.migrate()
    finally:
        db.close()
    if wants_json(args):
        output.emit_json({"applied": applied})
    elif applied:
        output.line("applied migrations " + ", ".join(str(v) for v in applied))
    else:
        output.line("the schema is up to date")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    db = open_database(database_url(args.database_url))
    try:
        states = db.migration_status()
    finally:
        db.close()
    rows = [
        {"version": s.version, "name": s.name, "applied": s.applied, "applied_at_ms": s.applied_at_ms}
        for s in states
    ]
    if wants_json(args):
        output.emit_json({"migrations": rows, "pending": sum(1 for r in rows if not r["applied"])})
    else:
        output.table(("VERSION", "NAME", "APPLIED"), [(r["version"], r["name"], r["applied"]) for r in rows])
    return EXIT_OK


def database_flag(parser: Parser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="sqlite:///PATH or postgresql://... (env QL3_DATABASE_URL; default sqlite:///$QL3_HOME/ql3.db)",
    )


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("db", help="database schema", description="Database schema.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    database_flag(add_command(actions, "migrate", cmd_migrate, "apply pending migrations"))
    database_flag(add_command(actions, "status", cmd_status, "list migrations and whether they are applied"))
