"""Files are private: every state file of ``ql3 serve`` is 0600 and every directory 0700, whatever the
umask it was started with; a group- or world-accessible ``QL3_HOME`` is refused (exit 64)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.support.server import run_cli, start_server, stop

pytestmark = pytest.mark.slow


def _modes(home: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(home.stat().st_mode)}
    for path in home.rglob("*"):
        found[str(path.relative_to(home))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_every_state_file_is_private_even_under_umask_022(tmp_path: Path) -> None:
    # Given a server started by a process whose umask is the usual 022
    previous = os.umask(0o022)
    try:
        server = start_server(tmp_path / "home")
    finally:
        os.umask(previous)
    try:
        # When a task with a secret env value runs, so that the database, its WAL, the journal, a log
        # and a receipt all exist
        server.cli_json("task", "add", "secretive", "--command", "echo hi", "--env", "DB_PASSWORD=s3cr3t")
        done = server.cli("run", "start", "secretive", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "succeeded"
        modes = _modes(server.home)
    finally:
        stop(server.process)

    # Then nothing under QL3_HOME is reachable by group or others
    for name in ("ql3.db", "ql3.db-wal", "ql3.db-shm", "credentials", "lease.secret", "variables.key"):
        assert name in modes, sorted(modes)
    assert any(name.startswith("worker/logs/") and name.endswith(".log") for name in modes), sorted(modes)
    exposed = {name: f"{mode:04o}" for name, mode in modes.items() if mode & 0o077}
    assert exposed == {}


def test_a_group_readable_home_is_refused_at_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o750)

    for command in (("serve", "--listen", "127.0.0.1:1"), ("init",)):
        done = run_cli(*command, home=home)

        assert done.returncode == 64, (command, done.stderr)
        assert "error: home_not_private:" in done.stderr
        assert "chmod 700" in done.stderr
    assert list(home.iterdir()) == []  # nothing was created in it


def test_an_existing_world_readable_database_is_tightened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run_cli("init", home=home).returncode == 0
    os.chmod(home / "ql3.db", 0o644)

    assert run_cli("init", home=home).returncode == 0

    assert stat.S_IMODE((home / "ql3.db").stat().st_mode) == 0o600
