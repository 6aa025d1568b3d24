"""The run.create handler's inspect refuses a plan that does not name the dispatch's own project,
action and exact task revision content: such a plan is blocked before anything runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ql3.application.approved_action_handlers import InspectBlocked, RunCreateHandler
from ql3.domain.approvals import build_run_create_plan, parse_run_create_plan
from tests.support.approval_builders import dispatched, world
from tests.support.databases import Harness


def _blocked_code(harness: Harness, dispatch: object) -> str:
    with pytest.raises(InspectBlocked) as caught:
        harness.db.transaction(lambda tx: RunCreateHandler().inspect(tx, dispatch), write=False)  # type: ignore[arg-type]
    return caught.value.result_code


def test_the_approved_plan_inspects_to_its_digest(harness: Harness) -> None:
    dispatch = dispatched(world(harness.db))
    digest = harness.db.transaction(lambda tx: RunCreateHandler().inspect(tx, dispatch), write=False)
    assert digest == parse_run_create_plan(dispatch.action_plan).digest()


def test_a_plan_for_another_project_or_action_is_blocked(harness: Harness) -> None:
    dispatch = dispatched(world(harness.db))
    assert _blocked_code(harness, replace(dispatch, project_id="another-project")) == "plan_identity_mismatch"
    assert _blocked_code(harness, replace(dispatch, action_ref="another-action")) == "plan_identity_mismatch"


def test_a_plan_whose_task_snapshot_differs_from_the_revision_is_blocked(harness: Harness) -> None:
    dispatch = dispatched(world(harness.db))
    plan = parse_run_create_plan(dispatch.action_plan)
    assert plan.task_snapshot_ref is not None
    other = "f" * len(plan.task_snapshot_ref) if set(plan.task_snapshot_ref) != {"f"} else "e" * 64
    drifted = build_run_create_plan(
        project_id=plan.project_id,
        task_id=plan.task_id,
        task_revision=plan.task_revision,
        priority=plan.priority,
        task_name=plan.task_name,
        task_snapshot_ref=other,
        input_ref=plan.input_ref,
        executor_type=plan.executor_type,
    )
    tampered = replace(dispatch, action_plan=drifted.canonical(), action_ref=drifted.action_ref)
    assert _blocked_code(harness, tampered) == "task_snapshot_mismatch"
