"""ExecutionSpec normalisation: independent copies, unknown fields stripped, every bound checked."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ql3.application.dispatcher import plan_from_spec
from ql3.domain.errors import ValidationFailed
from ql3.domain.offers import normalize_spec, spec_digest
from ql3.domain.tasks import MAX_COMMAND_BYTES, MAX_GRACE_MS, MAX_TIMEOUT_MS, build_spec


def _raw(**extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "runId": "run-1",
        "attemptId": "att-1",
        "projectId": "proj-1",
        "taskId": "task-1",
        "taskRevision": "3",
        "command": {"kind": "shell", "command": "echo hi"},
        "environmentPolicy": "isolated",
        "environment": {"B": "2", "A": "1"},
        "workingDirectory": "/srv",
        "timeoutMs": 1_000,
        "terminationGraceMs": 2_000,
    }
    raw.update(extra)
    return raw


def test_the_normalised_spec_shares_no_mutable_state_with_its_source() -> None:
    raw = _raw()
    pristine = copy.deepcopy(raw)
    out = normalize_spec(raw)
    kept = copy.deepcopy(out)

    # Changing the result leaves the source as it was
    out["environment"]["A"] = "changed"
    out["environment"]["NEW"] = "x"
    out["command"]["command"] = "rm -rf /"
    assert raw == pristine

    # and changing the source afterwards leaves a fresh result as it was
    out = normalize_spec(raw)
    raw["environment"]["A"] = "changed"
    raw["command"]["command"] = "rm -rf /"
    assert out == kept


def test_unknown_fields_are_stripped_at_every_level_and_keys_are_in_digest_order() -> None:
    out = normalize_spec(
        _raw(
            argv=["sh", "-c", "evil"],
            secretToken="t",
            command={"kind": "shell", "command": "echo hi", "argv": ["x"], "env": {"K": "v"}},
        )
    )

    assert set(out) == {
        "runId",
        "attemptId",
        "projectId",
        "taskId",
        "taskRevision",
        "command",
        "workingDirectory",
        "environmentPolicy",
        "environment",
        "timeoutMs",
        "terminationGraceMs",
    }
    assert out["command"] == {"kind": "shell", "command": "echo hi"}
    assert list(out["environment"]) == ["A", "B"]
    assert spec_digest(out) == spec_digest(normalize_spec(_raw()))


@pytest.mark.parametrize(
    "change",
    [
        {"command": {"kind": "exec", "command": "echo hi"}},
        {"command": {"kind": "shell", "command": "echo \x00 hi"}},
        {"command": {"kind": "shell", "command": "x" * (MAX_COMMAND_BYTES + 1)}},
        {"command": {"kind": "shell", "command": "   "}},
        {"command": "echo hi"},
        {"runId": ""},
        {"attemptId": "a\nb"},
        {"projectId": None},
        {"taskId": "t" * 256},
        {"workingDirectory": "relative/dir"},
        {"workingDirectory": "/srv\x00"},
        {"environmentPolicy": "host"},
        {"environment": {"A": 1}},
        {"environment": ["A=1"]},
        {"timeoutMs": 0},
        {"timeoutMs": MAX_TIMEOUT_MS + 1},
        {"timeoutMs": True},
        {"terminationGraceMs": -1},
        {"terminationGraceMs": MAX_GRACE_MS + 1},
        {"terminationGraceMs": 1.5},
    ],
    ids=lambda change: next(iter(change)),
)
def test_every_field_is_validated(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationFailed):
        normalize_spec(_raw(**change))


def test_the_bounds_themselves_are_accepted() -> None:
    out = normalize_spec(
        _raw(
            command={"kind": "shell", "command": "x" * MAX_COMMAND_BYTES},
            timeoutMs=MAX_TIMEOUT_MS,
            terminationGraceMs=0,
        )
    )
    assert (out["timeoutMs"], out["terminationGraceMs"]) == (MAX_TIMEOUT_MS, 0)
    assert normalize_spec(_raw(timeoutMs=1, terminationGraceMs=MAX_GRACE_MS))["timeoutMs"] == 1


def test_a_plan_and_its_task_spec_share_no_mutable_state() -> None:
    task_spec = build_spec({"command": "echo hi", "env": {"A": "1"}})

    plan = plan_from_spec(task_spec, "run-1", "att-1", "proj-1", "task-1", 1)
    plan["environment"]["A"] = "changed"
    assert task_spec.env == {"A": "1"}

    plan = plan_from_spec(task_spec, "run-1", "att-1", "proj-1", "task-1", 1)
    task_spec.env["A"] = "changed"
    assert plan["environment"] == {"A": "1"}
