"""New tasks do not inherit the server's environment unless asked to."""

from __future__ import annotations

from ql3.domain.tasks import build_spec


def test_a_new_task_defaults_to_the_isolated_environment() -> None:
    assert build_spec({"command": "true"}).environment_policy == "isolated"
    assert build_spec({"command": "true", "environment_policy": "inherit"}).environment_policy == "inherit"
