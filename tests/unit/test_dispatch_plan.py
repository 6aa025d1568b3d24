"""The ExecutionSpec the dispatcher and the pull build from a pinned task revision (``plan_from_spec``,
docs/contracts.md §7): every task setting reaches the spec under its own name, settings left unset
are absent rather than null, and a spec whose identity drifted from the candidate's is refused."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import dispatcher as dispatcher_module
from ql3.application.dispatcher import plan_from_spec
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import build_spec

IDENTITY = ("run-1", "attempt-1", "project-1", "task-1")


def test_every_task_setting_reaches_the_execution_spec() -> None:
    # Given a revision that sets everything away from the spec's defaults
    task = build_spec(
        {
            "command": "echo hi",
            "cwd": "/srv/job",
            "env": {"B": "2", "A": "1"},
            "environment_policy": "isolated",
            "timeout_ms": 1234,
            "grace_ms": 777,
        }
    )

    # When the plan is built for one candidate
    spec = plan_from_spec(task, *IDENTITY, 7)

    # Then the spec is exactly the candidate's identity and the revision's settings
    assert spec == {
        "runId": "run-1",
        "attemptId": "attempt-1",
        "projectId": "project-1",
        "taskId": "task-1",
        "taskRevision": "7",
        "command": {"kind": "shell", "command": "echo hi"},
        "workingDirectory": "/srv/job",
        "environmentPolicy": "isolated",
        "environment": {"A": "1", "B": "2"},
        "timeoutMs": 1234,
        "terminationGraceMs": 777,
    }


def test_settings_left_unset_are_absent_from_the_spec() -> None:
    spec = plan_from_spec(build_spec({"command": "true", "environment_policy": "inherit"}), *IDENTITY, 1)

    assert "workingDirectory" not in spec and "timeoutMs" not in spec
    assert (spec["environmentPolicy"], spec["environment"], spec["terminationGraceMs"]) == (
        "inherit",
        {},
        5000,
    )


@pytest.mark.parametrize("key", ["runId", "attemptId", "projectId", "taskId", "taskRevision"])
def test_a_spec_whose_identity_drifted_is_refused(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = dispatcher_module.normalize_spec  # type: ignore[attr-defined]

    def drifted(raw: dict[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = real(raw)
        return spec | {key: "other"}

    monkeypatch.setattr(dispatcher_module, "normalize_spec", drifted)

    with pytest.raises(ValidationFailed) as caught:
        plan_from_spec(build_spec({"command": "true"}), *IDENTITY, 3)
    assert (caught.value.message, dict(caught.value.details)) == (
        "execution spec identity drifted",
        {"field": "spec"},
    )
