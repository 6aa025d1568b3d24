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

from tests.support.server import Server, start_server, stop

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
    from tests.support.server import run_cli

    for user in ("root", "no-such-user-ql3"):
        done = run_cli("serve", "--run-as", user, "--listen", "127.0.0.1:1", home=tmp_path / "home")

        assert done.returncode == 64, done.stderr
        assert "error: bad_run_as:" in done.stderr


OTHER_USER = "ql3-task-test-b"


@pytest.fixture(scope="module")
def other_user(task_user: str) -> str:
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            check=True,
            capture_output=True,
        )
    return OTHER_USER


def _run_in(server: Server, project: str, name: str, command: str) -> tuple[dict[str, object], str]:
    server.cli_json("task", "add", name, "-p", project, "--command", command, "--cwd", "/tmp")
    done = server.cli("run", "start", name, "-p", project, "--wait", "--json")
    run = json.loads(done.stdout)
    logs = server.cli("run", "logs", str(run["id"]), "-p", project)
    assert logs.returncode == 0, logs.stderr
    return run, logs.stdout


def test_each_project_runs_as_its_own_task_user(task_user: str, other_user: str, open_parent: Path) -> None:
    # Given a server whose projects "default" and "beta" each have their own task user
    home = open_parent / "home"
    first = start_server(home)
    try:
        assert first.cli("project", "create", "beta").returncode == 0
    finally:
        stop(first.process)
    server = start_server(
        home, "--project-run-as", f"default={task_user}", "--project-run-as", f"beta={other_user}"
    )
    try:
        # and a run of project beta that wrote its log (and its secret) first
        beta_run, beta_log = _run_in(server, "beta", "b-first", "echo beta-secret-output; echo uid=$(id -u)")
        beta_logs = sorted(str(p) for p in (home / "worker" / "logs").rglob("*.log"))
        targets = [
            home / "credentials",
            home / "ql3.db",
            home / "ql3.db-wal",
            home / "lease.secret",
            home / "worker" / "journal.db",
            home / "worker" / "journal.key",
            *beta_logs,
        ]
        probe = "; ".join(
            f"if cat '{t}' >/dev/null 2>&1; then echo 'READ {t}'; else echo 'DENIED {t}'; fi" for t in targets
        )
        probe += "; echo uid=$(id -u); env"

        # When a task of project default probes them
        run, log = _run_in(server, "default", "a-probe", probe)
    finally:
        stop(server.process)

    # Then each project's command ran as its own user, and default's read nothing of the server or beta
    assert beta_run["status"] == "succeeded" and f"uid={pwd.getpwnam(other_user).pw_uid}" in beta_log
    assert beta_logs
    assert run["status"] == "succeeded", log
    assert f"uid={pwd.getpwnam(task_user).pw_uid}" in log
    assert "READ " not in log and log.count("DENIED ") == len(targets)
    assert "beta-secret-output" not in log
    assert not [line for line in log.splitlines() if str(home) in line and not line.startswith("DENIED ")]
    # (no --run-as default: the server said that other projects' tasks run as its own user)
    assert "warning: tasks run as this server's own user" in server.log()


def test_a_bad_project_task_user_is_a_usage_error(task_user: str, tmp_path: Path) -> None:
    from tests.support.server import run_cli

    home = tmp_path / "home"
    stop(start_server(home).process)
    own = pwd.getpwuid(os.geteuid()).pw_name
    cases = [
        (["--project-run-as", "nosuchproject=" + task_user], "no such project"),
        (["--project-run-as", "default=no-such-user-ql3"], "no such user"),
        (["--project-run-as", f"default={own}"], "the server's own user"),
        (["--project-run-as", "default"], "PROJECT=USER"),
        (["--project-run-as", f"default={task_user}", "--project-run-as", f"default={task_user}"], "twice"),
    ]
    for flags, message in cases:
        done = run_cli("serve", *flags, "--listen", "127.0.0.1:1", home=home)

        assert done.returncode == 64, (flags, done.stderr)
        assert message in done.stderr, (flags, done.stderr)


def test_the_servers_own_user_is_allowed_for_a_project_only_explicitly(
    task_user: str, open_parent: Path
) -> None:
    own = pwd.getpwuid(os.geteuid())
    server = start_server(
        open_parent / "home",
        "--run-as",
        task_user,
        "--project-run-as",
        f"default={own.pw_name}",
        "--allow-server-user",
    )
    try:
        run, log = _run(server, "as-server", "echo uid=$(id -u)")
    finally:
        stop(server.process)

    assert run["status"] == "succeeded" and f"uid={own.pw_uid}" in log
    assert "warning: tasks of project default run as this server's own user" in server.log()


def test_a_script_task_runs_as_the_task_user_and_cannot_change_its_script(
    task_user: str, open_parent: Path
) -> None:
    server = start_server(open_parent / "home", "--run-as", task_user)
    try:
        home = server.home
        # Given a shell script (run by bash) and a file with a shebang and no known suffix (executed itself)
        probe = open_parent / "probe.sh"
        probe.write_text(
            "echo uid=$(id -u) script=$QL3_SCRIPT_PATH\n"
            'echo x >> "$QL3_SCRIPT" 2>/dev/null && echo WROTE-SCRIPT || echo DENIED write\n'
            'touch "$(dirname "$QL3_SCRIPT")/other" 2>/dev/null && echo WROTE-DIR || echo DENIED dir\n'
            'ls "$(dirname "$(dirname "$(dirname "$QL3_SCRIPT")")")" >/dev/null 2>&1 && echo LISTED '
            "|| echo DENIED listing\n"
            'chmod 777 "$QL3_SCRIPT" 2>/dev/null && echo CHMODDED || echo DENIED chmod\n'
            f"ls '{home}' >/dev/null 2>&1 && echo LISTED-HOME || echo DENIED home\n"
            'echo "at $QL3_SCRIPT"\n'
        )
        tool = open_parent / "tool"
        tool.write_text("#!/bin/sh\necho tool-ran-as=$(id -u)\n")
        for source, path in ((probe, "jobs/probe.sh"), (tool, "jobs/tool")):
            put = server.cli("script", "put", str(source), path)
            assert put.returncode == 0, put.stderr
        server.cli_json("task", "add", "probe", "--script", "jobs/probe.sh", "--cwd", "/tmp")
        server.cli_json("task", "add", "tool", "--script", "jobs/tool", "--cwd", "/tmp")

        # When both run on a server whose tasks run as the task user
        runs = {}
        for name in ("probe", "tool"):
            done = server.cli("run", "start", name, "--wait", "--json")
            run = json.loads(done.stdout)
            logs = server.cli("run", "logs", str(run["id"]))
            runs[name] = (run["status"], logs.stdout)
        stored = sorted(p for p in Path(tempfile.gettempdir()).glob("ql3-scripts-0-*/*/*/probe.sh"))
    finally:
        stop(server.process)

    # Then each ran as the task user, from a file it could read and execute but neither change nor
    # replace, outside the server's home, which it still cannot list
    uid = pwd.getpwnam(task_user).pw_uid
    status, log = runs["probe"]
    assert status == "succeeded", log
    assert f"uid={uid} script=jobs/probe.sh" in log
    assert "WROTE" not in log and "LISTED" not in log and "CHMODDED" not in log, log
    assert log.count("DENIED ") == 5, log
    at = next(line for line in log.splitlines() if line.startswith("at "))[3:]
    assert not at.startswith(str(home)) and Path(at) in stored
    assert Path(at).read_text() == probe.read_text()
    assert runs["tool"][0] == "succeeded" and f"tool-ran-as={uid}" in runs["tool"][1], runs["tool"]
    shutil.rmtree(Path(at).parents[2], ignore_errors=True)  # the host's temporary directory
