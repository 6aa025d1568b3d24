"""Pure approval rules: the canonical run.create plan and digests, codes, results, effective states."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ql3.domain import approvals as A
from ql3.domain.digests import domain_digest, sha256_hex
from ql3.domain.errors import ValidationFailed

TASK = "01890000-0000-7000-8000-000000000001"
PROJECT = "01890000-0000-7000-8000-000000000002"


def _plan(**kw: object) -> A.RunCreatePlan:
    args: dict[str, object] = {
        "project_id": PROJECT,
        "task_id": TASK,
        "task_revision": 3,
        "priority": 0,
        "task_name": "deploy",
        "task_snapshot_ref": None,
    }
    args.update(kw)
    return A.build_run_create_plan(**args)  # type: ignore[arg-type]


def test_the_plan_is_compact_json_in_the_fixed_key_order() -> None:
    plan = _plan(priority=5)

    assert plan.canonical() == (
        '{"schemaVersion":1,"actionType":"run.create","actionRef":"'
        + TASK
        + '","projectId":"'
        + PROJECT
        + '",'
        '"taskId":"' + TASK + '","taskRevision":"3","executorType":"local_process","priority":5,'
        '"taskName":"deploy","taskSnapshotRef":null,"inputRef":null}'
    )
    assert plan.digest() == sha256_hex(plan.canonical())
    assert plan.action_ref == TASK


def test_the_plan_digest_changes_with_every_bound_field() -> None:
    base = _plan()
    variants = [
        _plan(priority=1),
        _plan(task_revision=4),
        _plan(task_name=None),
        _plan(task_snapshot_ref="a" * 64),
        _plan(input_ref="input-1"),
        _plan(project_id="p2"),
    ]

    assert len({base.digest(), *(v.digest() for v in variants)}) == len(variants) + 1


def test_a_stored_plan_parses_only_when_canonical() -> None:
    text = _plan().canonical()
    assert A.parse_run_create_plan(text) == _plan()

    raw = json.loads(text)
    reordered = json.dumps(dict(reversed(list(raw.items()))), separators=(",", ":"))
    spaced = json.dumps(raw)
    extra = text[:-1] + ',"command":"rm -rf /"}'
    for bad in (
        reordered,
        spaced,
        extra,
        "not json",
        "[]",
        text.replace('"3"', "3"),
        text.replace('"3"', '"03"'),
    ):
        with pytest.raises(ValidationFailed):
            A.parse_run_create_plan(bad)


@pytest.mark.parametrize(
    "kw",
    [
        {"priority": 2**31},
        {"priority": True},
        {"task_revision": 0},
        {"task_id": ""},
        {"task_id": "x" * 256},
        {"task_name": "bad\nname"},
        {"executor_type": "docker"},
    ],
)
def test_invalid_plans_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ValidationFailed):
        _plan(**kw)


@pytest.mark.parametrize("code", ["a", "looks_good", "a" * 64, "x9_"])
def test_valid_codes(code: str) -> None:
    assert A.validate_code(code) == code


@pytest.mark.parametrize("code", ["", "A", "9a", "a-b", "a b", "a" * 65, None, "é"])
def test_invalid_codes(code: object) -> None:
    with pytest.raises(ValidationFailed):
        A.validate_code(code)


def test_result_shapes_map_to_terminal_statuses() -> None:
    assert A.validate_result("succeeded", "ok", "a" * 64) == "succeeded"
    assert A.validate_result("failed", "exit_1", None) == "failed"
    assert A.validate_result("indeterminate", "lost", None) == "blocked"
    for outcome, digest in (("succeeded", None), ("succeeded", "A" * 64), ("failed", "a" * 64), ("x", None)):
        with pytest.raises(ValidationFailed):
            A.validate_result(outcome, "ok", digest)


def test_ttl_and_limits_are_bounded() -> None:
    assert A.validate_ttl(A.MAX_APPROVAL_TTL_MS) == 24 * 3600 * 1000
    for bad in (0, A.MAX_APPROVAL_TTL_MS + 1, True, 1.5):
        with pytest.raises(ValidationFailed):
            A.validate_ttl(bad)
    assert A.validate_page(64) == 64
    for page in (0, 65):
        with pytest.raises(ValidationFailed):
            A.validate_page(page)
    assert A.validate_lease_ms(600_000) == 600_000
    with pytest.raises(ValidationFailed):
        A.validate_lease_ms(600_001)
    assert A.validate_max_attempts(16) == 16
    with pytest.raises(ValidationFailed):
        A.validate_max_attempts(17)


def test_backoffs_are_capped() -> None:
    assert [A.retry_delay_ms(n) for n in (1, 2, 3)] == [1_000, 2_000, 4_000]
    assert A.retry_delay_ms(16) == A.RETRY_MAX_MS
    assert A.rescan_delay_ms(1) == 30_000 and A.rescan_delay_ms(40) == A.RESCAN_MAX_MS


def test_the_approval_state_machine() -> None:
    assert A.approval_transition_allowed("pending", 1, "approved", 2)
    assert A.approval_transition_allowed("pending", 1, "rejected", 2)
    assert A.approval_transition_allowed("approved", 2, "consumed", 3)
    assert not A.approval_transition_allowed("rejected", 2, "approved", 2)
    assert not A.approval_transition_allowed("consumed", 3, "approved", 2)
    assert not A.approval_transition_allowed("pending", 1, "consumed", 3)


def test_the_execution_state_machine_never_leaves_executing_for_a_due_state() -> None:
    assert A.execution_transition_allowed("leased", "executing")
    for due in ("pending", "leased", "retry_wait"):
        assert not A.execution_transition_allowed("executing", due)
    for terminal in A.TERMINAL_EXECUTION:
        assert A.EXECUTION_TRANSITIONS[terminal] == frozenset()


def _execution(**kw: object) -> A.Execution:
    base = A.Execution(
        dispatch_id="d",
        dispatch_digest="a" * 64,
        project_id="p",
        status="executing",
        version=2,
        attempt_count=1,
        max_attempts=5,
        eligible_at_ms=None,
        next_attempt_at_ms=None,
        lease_owner="o",
        lease_token_digest="b" * 64,
        lease_expires_at_ms=1_000,
        started_at_ms=500,
        result_mutation_id=None,
        result_code=None,
        result_digest=None,
        completed_at_ms=None,
        created_at_ms=0,
        updated_at_ms=500,
        execution_digest="c" * 64,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_recovery_required_is_computed_at_the_lease_expiry() -> None:
    ex = _execution()

    assert A.effective_execution_status(ex, 999) == "executing"
    assert A.effective_execution_status(ex, 1_000) == "recovery_required"
    assert A.effective_execution_status(replace(ex, status="leased"), 5_000) == "leased"


def test_expired_is_computed_at_the_expiry_instant() -> None:
    req = A.ApprovalRequest(
        id="r",
        project_id="p",
        version=1,
        state="pending",
        permission="run.create",
        action_type="run.create",
        action_ref="t",
        action_digest="a" * 64,
        action_plan="{}",
        preview_digest="b" * 64,
        risk="medium",
        requested_by="u",
        requested_at_ms=0,
        expires_at_ms=100,
        request_fence="{}",
        request_digest="c" * 64,
    )

    assert A.effective_approval_state(req, 99) == "pending"
    assert A.effective_approval_state(req, 100) == "expired"
    assert A.effective_approval_state(replace(req, state="rejected"), 100) == "rejected"


def test_record_digests_are_domain_separated() -> None:
    fields = {
        "approval_id": "r",
        "project_id": "p",
        "permission": "run.create",
        "action_type": "run.create",
        "action_ref": "t",
        "action_digest": "a" * 64,
        "preview_digest": "b" * 64,
        "risk": "medium",
        "requested_by": "u",
        "requested_at_ms": 0,
        "expires_at_ms": 1,
        "request_fence": "{}",
    }
    digest = A.approval_request_digest(**fields)  # type: ignore[arg-type]

    body = (
        '{"id":"r","projectId":"p","permission":"run.create","actionType":"run.create","actionRef":"t",'
        f'"actionDigest":"{"a" * 64}","previewDigest":"{"b" * 64}","risk":"medium","requestedBy":"u",'
        '"requestedAt":0,"expiresAt":1,"requestFence":"{}"}'
    )
    assert digest == domain_digest("qinglong/approval-request-digest@v1", body)
    assert digest != A.approval_request_digest(**{**fields, "risk": "high"})  # type: ignore[arg-type]
    assert A.lease_token_digest("t" * 43) != A.recovery_token_digest("t" * 43) != sha256_hex("t" * 43)


def test_the_fence_never_shows_its_token() -> None:
    fence = A.ExecutionFence(dispatch_id="d", owner="o", token="secret-token-value", version=1, attempt=1)

    assert "secret-token-value" not in repr(fence)
