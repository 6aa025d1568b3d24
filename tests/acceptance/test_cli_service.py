"""Running ``ql3 serve`` as a service: one server per QL3_HOME (a lock), a taken port changes nothing,
a systemd unit, the first-start guidance, and the scripts directory tasks run in by default."""

from __future__ import annotations

import configparser
import shlex
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.server import CLI, Server, base_env, free_port, run_cli, start_server, stop

pytestmark = pytest.mark.slow


def _serve_once(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A ``ql3 serve`` expected to refuse to start (bounded by a timeout if it started anyway)."""
    return subprocess.run(
        [*CLI, "serve", *args],
        env=base_env(home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_second_server_on_the_same_home_stops_with_a_clear_message(serve: Server) -> None:
    before = (serve.home / "credentials").read_bytes()

    done = _serve_once(serve.home, "--listen", f"127.0.0.1:{free_port()}")

    assert done.returncode == 75
    assert done.stderr.startswith(
        f"error: already_serving: a ql3 server already runs for QL3_HOME={serve.home}"
    )
    assert "Traceback" not in done.stderr and "serving on" not in done.stderr
    assert (serve.home / "credentials").read_bytes() == before
    assert serve.process.poll() is None and serve.cli("task", "list").returncode == 0


def test_a_taken_port_is_reported_and_no_credentials_are_written(serve: Server, tmp_path: Path) -> None:
    # Given another home whose server would use the port the first server holds
    other = tmp_path / "other"
    port = serve.url.rsplit(":", 1)[1]

    done = _serve_once(other, "--listen", f"127.0.0.1:{port}")

    assert done.returncode == 69
    assert done.stderr.startswith(f"error: address_in_use: cannot listen on 127.0.0.1:{port}")
    assert "--listen" in done.stderr and "Traceback" not in done.stderr
    assert not (other / "credentials").exists() and not (other / "ql3.db").exists()


def test_the_lock_is_released_when_the_server_is_killed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = start_server(home)
    stop(first.process, 9)

    second = start_server(home)  # would exit 75 if the lock outlived the process
    try:
        assert second.cli("task", "list").returncode == 0
    finally:
        stop(second.process)


def test_the_first_start_says_where_the_console_is_and_how_to_sign_in(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = start_server(home)
    stop(first.process)
    again = start_server(home)
    stop(again.process)

    log = first.log()
    assert "first start: the owner was created" in log
    assert f"console: open {first.url}/ and paste the token" in log and str(home / "credentials") in log
    assert first.credentials()["token"] not in log + again.log()
    assert "first start" not in again.log()


def test_print_systemd_unit_runs_this_server(tmp_path: Path) -> None:
    home = tmp_path / "home"

    done = run_cli("serve", "--print-systemd-unit", "--listen", "127.0.0.1:5799", "--slots", "3", home=home)

    assert done.returncode == 0, done.stderr
    # systemd has no inline comments: a "#" after a value would be part of it
    assert all(" #" not in line for line in done.stdout.splitlines() if not line.startswith("#"))
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(done.stdout)
    service = unit["Service"]
    command = shlex.split(service["ExecStart"])
    assert command[1:] == ["serve", "--listen", "127.0.0.1:5799", "--profile", "standalone", "--slots", "3"]
    assert Path(command[0]).name == "ql3" and Path(command[0]).is_absolute()
    assert service["Environment"] == f"QL3_HOME={home.resolve()}"
    assert service["KillMode"] == "process"  # running tasks outlive a restart
    assert service["RestartPreventExitStatus"].split() == ["64", "75"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert not home.exists()  # printing the unit writes nothing


def test_the_systemd_unit_keeps_the_task_users(tmp_path: Path) -> None:
    home = tmp_path / "home"
    flags = ["--run-as", "ql3-tasks", "--project-run-as", "billing=ql3-billing", "--allow-server-user"]

    done = run_cli("serve", "--print-systemd-unit", *flags, home=home)

    assert done.returncode == 0, done.stderr
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(done.stdout)
    command = shlex.split(unit["Service"]["ExecStart"])
    assert command[-len(flags) :] == flags
    assert not home.exists()


def test_the_access_log_is_on_by_default_and_off_with_no_access_log(serve: Server, tmp_path: Path) -> None:
    quiet = start_server(tmp_path / "quiet", "--no-access-log")
    try:
        for server in (serve, quiet):
            assert server.cli("task", "list").returncode == 0

        # Then the default server logs the request, the quiet one does not (and still logs its start)
        assert "/api/v1/" in serve.log()
        assert "/api/v1/" not in quiet.log()
        assert "serving on" in quiet.log()
    finally:
        stop(quiet.process)

    # And the systemd unit keeps the choice
    done = run_cli("serve", "--print-systemd-unit", "--no-access-log", home=tmp_path / "unit")
    assert done.returncode == 0, done.stderr
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(done.stdout)
    assert "--no-access-log" in shlex.split(unit["Service"]["ExecStart"])


def test_tasks_run_in_the_scripts_directory_by_default(serve: Server) -> None:
    # Given the README's example: deploy.sh in $QL3_HOME/scripts and a task that runs ./deploy.sh
    scripts = serve.home / "scripts"
    (scripts / "deploy.sh").write_text('#!/bin/sh\necho "deploying from $(pwd)"\n')
    (scripts / "deploy.sh").chmod(0o700)
    serve.cli_json("task", "add", "deploy", "--command", "./deploy.sh")

    done = serve.cli("run", "start", "deploy", "--follow")
    shown = serve.cli("task", "show", "deploy")

    assert stat.S_IMODE(scripts.stat().st_mode) == 0o700
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"deploying from {scripts}\n"
    assert "working_dir     the server's scripts directory (default $QL3_HOME/scripts)" in shown.stdout


def test_the_scripts_directory_and_its_mode_are_settings(tmp_path: Path) -> None:
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    server = start_server(home, "--scripts-dir", str(elsewhere), "--scripts-mode", "0755")
    try:
        server.cli_json("task", "add", "where", "--command", "pwd")
        done = server.cli("run", "start", "where", "--follow")
    finally:
        stop(server.process)

    assert done.returncode == 0 and done.stdout == f"{elsewhere}\n"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755


@pytest.mark.parametrize("mode", ["0777", "0600", "rwx"])
def test_an_unsafe_scripts_mode_is_a_usage_error(tmp_path: Path, mode: str) -> None:
    done = run_cli("serve", "--scripts-mode", mode, "--listen", f"127.0.0.1:{free_port()}", home=tmp_path)

    assert done.returncode == 64 and "--scripts-mode" in done.stderr


def test_a_free_port_check_does_not_leave_the_port_bound(tmp_path: Path) -> None:
    # The refused start above closes its socket: the port is free again for anyone.
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert _serve_once(tmp_path / "h", "--listen", f"127.0.0.1:{port}").returncode == 69
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
