"""The console sessions' settings (QL3_SESSION_*, QL3_SIGNIN_*) are validated before anything opens:
an idle time longer than the absolute one, or a value out of range, is refused naming the variable;
``ql3 serve`` exits 64 on it (docs/configuration.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ql3.application.sessions import SessionPolicy
from ql3.application.settings import SettingsError, load_serve_settings


def _load(env: dict[str, str]) -> SessionPolicy:
    settings = load_serve_settings(
        {"QL3_HOME": "/tmp/ql3-unused", **env},
        profile="standalone",
        slots=None,
        worker_id=None,
        database_url=None,
        cpus=2,
    )
    return settings.sessions


def test_the_defaults_and_the_variables() -> None:
    assert _load({}) == SessionPolicy()
    policy = _load(
        {
            "QL3_SESSION_IDLE_S": "600",
            "QL3_SESSION_MAX_S": "7200",
            "QL3_SIGNIN_MAX_FAILURES": "4",
            "QL3_SIGNIN_ADDRESS_MAX_FAILURES": "40",
            "QL3_SIGNIN_LOCKOUT_S": "60",
        }
    )
    assert policy == SessionPolicy(
        idle_ms=600_000, max_ms=7_200_000, max_failures=4, lockout_ms=60_000, address_max_failures=40
    )


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"QL3_SESSION_IDLE_S": "7200", "QL3_SESSION_MAX_S": "600"}, "QL3_SESSION_IDLE_S"),
        ({"QL3_SESSION_MAX_S": "4"}, "QL3_SESSION_MAX_S"),
        ({"QL3_SESSION_IDLE_S": "ten"}, "QL3_SESSION_IDLE_S"),
        ({"QL3_SIGNIN_MAX_FAILURES": "0"}, "QL3_SIGNIN_MAX_FAILURES"),
        ({"QL3_SIGNIN_LOCKOUT_S": "86401"}, "QL3_SIGNIN_LOCKOUT_S"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as refused:
        _load(env)
    assert refused.value.variable == variable


def test_serve_exits_64_on_a_bad_session_setting(tmp_path: Path) -> None:
    env = {
        "QL3_HOME": str(tmp_path / "home"),
        "QL3_SESSION_IDLE_S": "7200",
        "QL3_SESSION_MAX_S": "600",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "ql3.cli.main", "serve", "--listen", "127.0.0.1:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 64, done.stderr
    assert "QL3_SESSION_IDLE_S" in done.stderr
    assert not (tmp_path / "home" / "ql3.db").exists()
