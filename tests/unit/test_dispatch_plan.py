"""The ExecutionSpec the dispatcher and the pull build from a pinned task revision
(``ExecutionSpec.for_attempt``, docs/contracts.md §7): every task setting reaches the spec's wire form
under its own name, and settings left unset are absent rather than null."""

from __future__ import annotations

from ql3.domain.execution import ExecutionSpec
from ql3.domain.tasks import TaskSpec, build_spec


def _plan(task: TaskSpec, revision: int) -> ExecutionSpec:
    return ExecutionSpec.for_attempt(
        task,
        run_id="run-1",
        attempt_id="attempt-1",
        project_id="project-1",
        task_id="task-1",
        task_revision=revision,
    )


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
    spec = _plan(task, 7)

    # Then the spec is exactly the candidate's identity and the revision's settings
    assert spec.to_wire() == {
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
    spec = _plan(build_spec({"command": "true", "environment_policy": "inherit"}), 1).to_wire()

    assert "workingDirectory" not in spec and "timeoutMs" not in spec
    assert (spec["environmentPolicy"], spec["environment"], spec["terminationGraceMs"]) == (
        "inherit",
        {},
        5000,
    )


def test_an_environment_given_out_of_order_is_sorted() -> None:
    task = TaskSpec(command="true", env={"Z": "1", "A": "2"})  # built directly, never through build_spec

    assert _plan(task, 1).environment == (("A", "2"), ("Z", "1"))
    assert list(_plan(task, 1).to_wire()["environment"]) == ["A", "Z"]
