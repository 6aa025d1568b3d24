"""``ql3 serve --run-as USER``: an operator's task runs as the task user and cannot read the server's
state (credentials, database, journal, other runs' logs), nor find it in its environment; without
``--run-as`` the server warns at start-up."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.conftest import Server, start_server, stop

pytestmark = pytest.mark.slow
TASK_USER = "ql3-task-test"


@pytest.fixture(scope="module")
def task_user() -> str:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the --run-as tests need root under CI")
        pytest.skip("the --run-as tests need root")
    try:
        pwd.getpwnam(TASK_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TASK_USER],
            check=True,
            capture_output=True,
        )
    return TASK_USER


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A world-traversable parent, so that only QL3_HOME's own modes protect the state."""
    parent = Path(tempfile.mkdtemp(prefix="ql3-runas-"))
    os.chmod(parent, 0o755)
    try:
        yield parent
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _run(server: Server, name: str, command: str) -> tuple[dict[str, object], str]:
    server.cli_json("task", "add", name, "--command", command, "--cwd", "/tmp")
    done = server.cli("run", "start", name, "--wait", "--json")
    run = json.loads(done.stdout)
    logs = server.cli("run", "logs", str(run["id"]))
    assert logs.returncode == 0, logs.stderr
    return run, logs.stdout


def test_a_task_cannot_read_the_servers_state(task_user: str, open_parent: Path) -> None:
    server = start_server(open_parent / "home", "--run-as", task_user)
    try:
        home = server.home
        # another run's log exists first
        first, _ = _run(server, "first", "echo other-projects-secret-output")
        assert first["status"] == "succeeded"
        other_logs = sorted(str(p) for p in (home / "worker" / "logs").rglob("*.log"))
        assert other_logs
        targets = [
            home / "credentials",
            home / "ql3.db",
            home / "ql3.db-wal",
            home / "lease.secret",
            home / "worker" / "journal.db",
            *other_logs,
        ]
        probe = "; ".join(
            f"if cat '{t}' >/dev/null 2>&1; then echo 'READ {t}'; else echo 'DENIED {t}'; fi" for t in targets
        )
        probe += f"; ls '{home}' >/dev/null 2>&1 && echo 'LISTED home' || echo 'DENIED listing'"
        probe += "; echo uid=$(id -u); env"

        # When an operator's task probes them
        run, log = _run(server, "probe", probe)
        expected_uid = pwd.getpwnam(task_user).pw_uid
    finally:
        stop(server.process)

    # Then it ran (as the task user), wrote its log, and read nothing
    assert run["status"] == "succeeded", log
    assert f"uid={expected_uid}" in log
    assert "READ " not in log and "LISTED" not in log
    assert log.count("DENIED ") == len(targets) + 1
    environment = [line for line in log.splitlines() if "=" in line and not line.startswith("uid=")]
    assert environment, log
    assert not [line for line in environment if str(home) in line or line.startswith("QL3_HOME=")]
    assert f"HOME={pwd.getpwnam(task_user).pw_dir}" in environment
    assert "other-projects-secret-output" not in log


def test_serve_warns_when_tasks_run_as_its_own_user(tmp_path: Path) -> None:
    server = start_server(tmp_path / "home")
    stop(server.process)

    assert "warning: tasks run as this server's own user" in server.log()


def test_run_as_root_or_an_unknown_user_is_a_usage_error(tmp_path: Path) -> None:
    from tests.acceptance.conftest import run_cli

    for user in ("root", "no-such-user-ql3"):
        done = run_cli("serve", "--run-as", user, "--listen", "127.0.0.1:1", home=tmp_path / "home")

        assert done.returncode == 64, done.stderr
        assert "error: bad_run_as:" in done.stderr
