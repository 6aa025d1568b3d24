"""``ql3 db backup`` copies the SQLite database consistently while the server runs tasks;
``ql3 db restore`` refuses while a server holds the home and brings the copy back once it is stopped."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from tests.support.server import Server, run_cli, spawn_cli, start_server, stop

pytestmark = pytest.mark.slow


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return list(conn.execute(sql).fetchall())
    finally:
        conn.close()


def test_a_backup_while_tasks_run_is_consistent_and_restores_after_a_stop(tmp_path: Path) -> None:
    # Given a server whose tasks keep running and writing while the backup is taken
    home = tmp_path / "home"
    server: Server = start_server(home)
    backup = tmp_path / "backup.db"
    try:
        server.cli_json("task", "add", "busy", "--command", "for i in 1 2 3 4 5; do echo $i; sleep 0.1; done")
        before = [server.cli_json("run", "start", "busy")["id"] for _ in range(3)]
        writers = [spawn_cli("run", "start", "busy", "--wait", home=home) for _ in range(4)]

        # When it is backed up twice during the writes
        first = server.cli("db", "backup", str(backup))
        again = server.cli("db", "backup", str(backup))
        forced = server.cli("db", "backup", str(backup), "--force", "--json")
        for writer in writers:
            assert writer.wait(timeout=120) == 0
            stop(writer)
        later = server.cli_json("run", "start", "busy")["id"]

        # And a restore is tried while the server runs
        refused = server.cli("db", "restore", str(backup))
    finally:
        stop(server.process)

    # Then the backup is a sound, self-contained ql3 database holding the runs made before it
    assert first.returncode == 0, first.stderr
    assert again.returncode == 64 and "--force" in again.stderr  # never overwritten silently
    assert forced.returncode == 0, forced.stderr
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert not Path(f"{backup}-wal").exists()
    assert _rows(backup, "PRAGMA integrity_check") == [("ok",)]
    assert _rows(backup, "PRAGMA foreign_key_check") == []
    saved = {str(r[0]) for r in _rows(backup, "SELECT id FROM runs")}
    assert set(before) <= saved and later not in saved
    # every run's events start at sequence 1 and have no gaps: no half-written transaction was copied
    for run_id, n, top in _rows(
        backup, "SELECT run_id, count(*), max(sequence) FROM run_events GROUP BY run_id"
    ):
        assert n == top, run_id
    # And the running server refused the restore without touching anything
    assert refused.returncode == 75 and "stop it before restoring" in refused.stderr

    # When the stopped server's database is restored and the server started again
    restored = run_cli("db", "restore", str(backup), home=home)
    again_server = start_server(home)
    try:
        listed = {r["id"] for r in again_server.cli_json("run", "list", "--limit", "100")["items"]}
    finally:
        stop(again_server.process)

    # Then it serves the backed-up state: the run made after the backup is gone
    assert restored.returncode == 0, restored.stderr
    assert set(before) <= listed and later not in listed


def test_restore_refuses_a_file_that_is_not_a_ql3_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()

    bad = run_cli("db", "restore", str(junk), home=tmp_path / "home")
    foreign = run_cli("db", "restore", str(other), home=tmp_path / "home")

    assert bad.returncode == 1 and "not a ql3 SQLite database" in bad.stderr
    assert foreign.returncode == 1 and "has no ql3 schema" in foreign.stderr
    assert not (tmp_path / "home" / "ql3.db").exists()


def test_backup_of_postgresql_points_to_pg_dump(tmp_path: Path) -> None:
    done = run_cli(
        "db",
        "backup",
        str(tmp_path / "x"),
        "--database-url",
        "postgresql://nobody@127.0.0.1:1/x",
        home=tmp_path,
    )

    assert done.returncode == 64 and "pg_dump" in done.stderr
