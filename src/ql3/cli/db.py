"""``ql3 db migrate|status|backup|restore``: straight on the database, not through the API."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path
from typing import Final

from ql3.bootstrap import open_database
from ql3.bootstrap import sqlite_backup as online
from ql3.cli import output
from ql3.cli.common import Parser, Subparsers, add_command, wants_json
from ql3.cli.config import database_url, home
from ql3.cli.errors import EXIT_OK, CliError, UsageError
from ql3.cli.lock import home_lock

BACKUP_HELP: Final = """\
SQLite only; for PostgreSQL use pg_dump / pg_restore (docs/operations.md).
The copy is consistent while ql3 serve runs and writes (SQLite's online backup API reads one
snapshot); it is written to FILE.tmp, checked, then renamed, with mode 0600 (it holds task env values
and token digests). Run logs are files under $QL3_HOME/worker/logs and are not in it.
"""
RESTORE_HELP: Final = """\
SQLite only. Refused while a ql3 serve holds $QL3_HOME (stop it first); FILE must be a ql3 database
(an integrity check and ql3's migration table). The current database is replaced; start the server
afterwards (it migrates a backup from an older version).
"""


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


def _sqlite_path(args: argparse.Namespace) -> Path:
    url = database_url(args.database_url)
    if not url.startswith("sqlite:///"):
        raise UsageError(
            "db backup and restore work on SQLite; for PostgreSQL use pg_dump and pg_restore "
            "(docs/operations.md)"
        )
    return Path(url.removeprefix("sqlite://"))


def _check_ql3_database(conn: sqlite3.Connection, what: str) -> int:
    """Fail unless ``conn`` is a sound ql3 database; return its schema version."""
    try:
        return online.check_ql3_database(conn, what)
    except online.BackupInvalid as exc:
        raise CliError(exc.code, str(exc)) from exc


def cmd_backup(args: argparse.Namespace) -> int:
    source_path = _sqlite_path(args)
    if not source_path.exists():
        raise CliError("no_database", f"there is no database at {source_path}")
    target = Path(args.file).absolute()
    if target.exists() and not args.force:
        raise UsageError(f"{target} exists; give --force to replace it")
    if target.resolve() == source_path.resolve():
        raise UsageError("FILE is the database itself")
    try:
        version = online.online_backup(source_path, target)
    except online.BackupInvalid as exc:
        raise CliError(exc.code, str(exc)) from exc
    size = target.stat().st_size
    if wants_json(args):
        output.emit_json({"file": str(target), "bytes": size, "schema_version": version})
    else:
        output.line(f"backed up {source_path} to {target} ({size} bytes, schema version {version})")
    return EXIT_OK


def _restore(backup: Path, target_path: Path) -> int:
    source = online.connect(backup, read_only=True)
    try:
        version = _check_ql3_database(source, str(backup))
        target_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = online.connect(target_path, read_only=False)
        try:
            source.backup(target, pages=-1)  # page by page into the live file, WAL included
        finally:
            target.close()
    finally:
        source.close()
    return version


def cmd_restore(args: argparse.Namespace) -> int:
    target_path = _sqlite_path(args)
    backup = Path(args.file).absolute()
    if not backup.is_file():
        raise UsageError(f"{backup} is not a file")
    try:
        with home_lock(home()):  # no server can start while the file is replaced
            version = _restore(backup, target_path)
    except CliError as exc:
        if exc.code != "already_serving":
            raise
        raise CliError(
            "server_running",
            f"a ql3 server is running on QL3_HOME={home()}: stop it before restoring",
            exc.exit_code,
        ) from None
    if wants_json(args):
        output.emit_json({"restored": str(backup), "database": str(target_path), "schema_version": version})
    else:
        output.line(f"restored {target_path} from {backup} (schema version {version}); start ql3 serve")
    return EXIT_OK


def database_flag(parser: Parser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="sqlite:///PATH or postgresql://... (env QL3_DATABASE_URL; default sqlite:///$QL3_HOME/ql3.db)",
    )


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "db", help="database schema, backup and restore", description="Database schema, backup and restore."
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    database_flag(add_command(actions, "migrate", cmd_migrate, "apply pending migrations"))
    database_flag(add_command(actions, "status", cmd_status, "list migrations and whether they are applied"))
    backup = add_command(
        actions,
        "backup",
        cmd_backup,
        "copy the SQLite database to FILE, consistent while the server runs",
        epilog=BACKUP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backup.add_argument("file", metavar="FILE", help="where to write the copy")
    backup.add_argument("--force", action="store_true", help="replace FILE if it exists")
    database_flag(backup)
    restore = add_command(
        actions,
        "restore",
        cmd_restore,
        "replace the SQLite database with a backup (the server must be stopped)",
        epilog=RESTORE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    restore.add_argument("file", metavar="FILE", help="a file written by ql3 db backup")
    database_flag(restore)
