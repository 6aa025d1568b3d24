"""``--print-systemd-unit`` of ``ql3 control`` and ``ql3 worker`` (and ``ql3 serve``'s, with the same
checks): the unit runs this very installation with the same options, every path absolute, only the
main process is stopped, a usage error is never restarted, and ``systemd-analyze verify`` (where the
machine has it) finds nothing to say."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.server import run_cli

pytestmark = pytest.mark.slow


def _unit(text: str) -> configparser.ConfigParser:
    # systemd has no inline comments: a "#" after a value would be part of it
    assert all(" #" not in line for line in text.splitlines() if not line.startswith("#"))
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(text)
    return unit


def _environment(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("Environment=")]
    return [shlex.split(line.partition("=")[2])[0] for line in lines]


def _verify(text: str, tmp_path: Path, name: str) -> None:
    """``systemd-analyze verify`` on the unit, where the machine has it: no error and no warning."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return
    path = tmp_path / f"{name}.service"
    path.write_text(text)
    done = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_the_control_unit_runs_this_replica(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = "postgresql://ql3@db1:5432,db2:5432/ql3?target_session_attrs=read-write"

    done = run_cli(
        "control",
        "--print-systemd-unit",
        "--listen",
        "0.0.0.0:5701",
        "--replica-id",
        "cp-b",
        "--no-access-log",
        home=home,
        env={"QL3_DATABASE_URL": url, "QL3_RUN_LEASE_MS": "20000"},
    )

    assert done.returncode == 0, done.stderr
    unit = _unit(done.stdout)
    service = unit["Service"]
    command = shlex.split(service["ExecStart"])
    assert Path(command[0]).name == "ql3" and Path(command[0]).is_absolute()
    assert command[1:] == [
        "control",
        "--listen",
        "0.0.0.0:5701",
        "--replica-id",
        "cp-b",
        "--profile",
        "standalone",
        "--no-access-log",
    ]
    # The database (from the environment) and the QL3_* settings go with it
    assert _environment(done.stdout) == [
        f"QL3_HOME={home.resolve()}",
        f"QL3_DATABASE_URL={url}",
        "QL3_RUN_LEASE_MS=20000",
    ]
    assert service["KillMode"] == "process" and service["RestartPreventExitStatus"] == "64"
    assert "ql3-control-cp-b.service" in done.stdout.splitlines()[0]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert not home.exists()  # printing the unit writes nothing
    _verify(done.stdout, tmp_path, "ql3-control-cp-b")


def test_the_control_unit_is_refused_for_sqlite_like_the_replica(tmp_path: Path) -> None:
    done = run_cli("control", "--print-systemd-unit", home=tmp_path / "home", env={"QL3_DATABASE_URL": ""})

    assert done.returncode == 64 and "control_needs_postgres" in done.stderr and done.stdout == ""


def test_the_worker_unit_runs_this_worker(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = tmp_path / "w1.token"
    token.write_text("t" * 43)
    token.chmod(0o600)
    ca = tmp_path / "ca.pem"
    ca.write_text("-")

    done = run_cli(
        "worker",
        "--server",
        "https://cp-a:5700",
        "--server",
        "https://cp-b:5701",
        "--token-file",
        str(token),
        "--slots",
        "8",
        "--label",
        "zone=a",
        "--label",
        "gpu=no",
        "--ca",
        str(ca),
        "--print-systemd-unit",
        home=home,
        env={"QL3_LOG_CAP_BYTES": "4096", "QL3_DATABASE_URL": "postgresql://never@db/ql3"},
    )

    assert done.returncode == 0, done.stderr
    service = _unit(done.stdout)["Service"]
    command = shlex.split(service["ExecStart"])
    assert command[1:] == [
        "worker",
        "--server",
        "https://cp-a:5700",
        "--server",
        "https://cp-b:5701",
        "--token-file",
        str(token),
        "--slots",
        "8",
        "--label",
        "zone=a",
        "--label",
        "gpu=no",
        "--home",
        str(home.resolve() / "remote-worker"),
        "--ca",
        str(ca),
    ]
    # A worker holds no database credentials: only its own settings are kept
    assert _environment(done.stdout) == ["QL3_LOG_CAP_BYTES=4096"]
    assert service["KillMode"] == "process"  # its runs outlive a restart and are re-adopted
    assert service["RestartPreventExitStatus"] == "64"
    assert not home.exists()
    _verify(done.stdout, tmp_path, "ql3-worker")


def test_the_worker_unit_refuses_what_the_worker_would_refuse(tmp_path: Path) -> None:
    token = tmp_path / "w1.token"
    token.write_text("t" * 43)
    token.chmod(0o644)

    flags = ["--server", "http://cp-a:5700", "--token-file", str(token), "--print-systemd-unit"]
    done = run_cli("worker", *flags, home=tmp_path)

    assert done.returncode == 64 and "token_file_not_private" in done.stderr and done.stdout == ""


def test_the_serve_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    done = run_cli("serve", "--print-systemd-unit", "--listen", "127.0.0.1:5799", home=tmp_path / "home")

    assert done.returncode == 0, done.stderr
    _verify(done.stdout, tmp_path, "ql3")


def test_a_percent_in_a_value_is_not_a_systemd_specifier(tmp_path: Path) -> None:
    url = "postgresql://ql3:p%40ss@db1/ql3"

    done = run_cli(
        "control", "--print-systemd-unit", "--database-url", url, "--replica-id", "cp-a", home=tmp_path / "h"
    )

    assert done.returncode == 0, done.stderr
    assert shlex.split(_unit(done.stdout)["Service"]["ExecStart"])[-1] == url.replace("%", "%%")
    _verify(done.stdout, tmp_path, "ql3-control-cp-a")
