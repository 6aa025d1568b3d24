"""The server's own configuration never reaches a task, even one that inherits the environment."""

from __future__ import annotations

import pytest

from ql3.ports.execution import ArgvCommand
from tests.support.processes import ExecHarness


def test_inherit_drops_the_servers_own_settings(ex: ExecHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("QL3_HOME", "QL3_DATABASE_URL", "QL3_TOKEN", "QL3_URL"):
        monkeypatch.setenv(name, f"server-only-{name}")
    monkeypatch.setenv("QL3_SOMETHING_ELSE", "kept")

    ex.launch("att-srv", ArgvCommand(file="env"), environment_policy="inherit")
    ex.wait_exit("att-srv")
    env = dict(line.split("=", 1) for line in ex.log_path("att-srv").read_text().splitlines())

    assert "server-only" not in "".join(env.values())
    assert env["QL3_SOMETHING_ELSE"] == "kept"
