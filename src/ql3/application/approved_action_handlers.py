"""Action handlers and evidence providers behind the start barrier (docs/contracts.md §10):
what an approved action does, how its inputs are inspected before the barrier, and the receipt-based
evidence that lets recovery close an action without a person."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from ql3.application import runs, tasks
from ql3.application.approved_actions import lock_execution
from ql3.domain.approvals import (
    RECEIPT_SCHEMA_VERSION,
    RUN_CREATE,
    RUN_CREATE_RESULT_CODE,
    Dispatch,
    Execution,
    ExecutionFence,
    RecoveryMode,
    RunActionReceipt,
    RunCreatePlan,
    lease_token_digest,
    parse_run_create_plan,
    validate_code,
)
from ql3.domain.digests import digest_equals
from ql3.domain.errors import (
    Conflict,
    FenceConflict,
    IdempotencyConflict,
    NotFound,
    Ql3Error,
    ValidationFailed,
)
from ql3.domain.model import Run
from ql3.ports.storage import Database, Transaction
from ql3.repositories import actions as action_store
from ql3.repositories import runs as run_records
from ql3.repositories.actions import StoredReceipt

log = logging.getLogger("ql3.approved_actions.handlers")


# -- handlers -----------------------------------------------------------------------------------


class InspectBlocked(Ql3Error):
    """The handler refused the approved plan; it will never run."""

    code = "approved_action_blocked"

    def __init__(self, result_code: str, message: str | None = None) -> None:
        super().__init__(message, result_code=validate_code(result_code, "result_code"))
        self.result_code = result_code


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerResult:
    """What ``execute`` proved. ``fence`` is the latest fence when the handler renewed its lease."""

    outcome: str
    result_code: str
    result_digest: str | None = None
    fence: ExecutionFence | None = None


class ActionHandler(Protocol):
    """Executes one action type behind the start barrier."""

    @property
    def action_type(self) -> str:
        """The ``actionType`` this handler owns."""
        ...

    @property
    def recovery_mode(self) -> RecoveryMode:
        """``automatic`` when it also provides trusted evidence, else ``manual_only``."""
        ...

    def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
        """Side-effect free (runs in a read-only transaction): parse the immutable plan and return the
        actual canonical action digest. Raise ``InspectBlocked`` for an invalid or refused plan; any
        other exception is transient and retried before the barrier within the attempt budget."""
        ...

    def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        """Called only after the barrier committed, at most once per barrier. Must make the downstream
        accept ``dispatch.id`` as its idempotency key (or leave a queryable receipt). A raise or an
        unprovable result is recorded as ``indeterminate -> blocked`` and never retried."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    finding: str
    result_code: str | None = None
    evidence_digest: str | None = None


class EvidenceProvider(Protocol):
    """Read-only evidence about an execution whose completion was lost."""

    @property
    def action_type(self) -> str: ...

    @property
    def recovery_mode(self) -> RecoveryMode: ...

    def probe(self, db: Database, dispatch: Dispatch, execution: Execution) -> Evidence:
        """Never executes, resends or parses logs. Returns ``verified_succeeded`` / ``verified_failed``
        (with an evidence digest), ``still_running``, ``missing``, ``conflict``, ``unsupported`` or
        ``unavailable``."""
        ...


class RunCreateHandler:
    """``run.create``: one transaction creates the Run (idempotency key = dispatch id) and its receipt."""

    action_type: str = RUN_CREATE
    recovery_mode: RecoveryMode = "automatic"

    def _plan(self, tx: Transaction, dispatch: Dispatch) -> tuple[RunCreatePlan, Any]:
        if dispatch.action_type != RUN_CREATE:
            raise InspectBlocked("unsupported_action")
        try:
            plan = parse_run_create_plan(dispatch.action_plan)
        except ValidationFailed as exc:
            raise InspectBlocked("invalid_plan") from exc
        if plan.project_id != dispatch.project_id or plan.action_ref != dispatch.action_ref:
            raise InspectBlocked("plan_identity_mismatch")
        try:
            task = tasks.find_task(tx, plan.project_id, plan.task_id)
            revision = tasks.get_revision(tx, task.id, plan.task_revision)
        except NotFound as exc:
            raise InspectBlocked("task_revision_unavailable") from exc
        if plan.task_snapshot_ref is not None and plan.task_snapshot_ref != revision.content_digest:
            raise InspectBlocked("task_snapshot_mismatch")
        # create_run pins task.revision: hand it the exact approved revision, never the latest.
        return plan, replace(task, revision=plan.task_revision)

    def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
        plan, _ = self._plan(tx, dispatch)
        return plan.digest()

    def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        return db.transaction(partial(self._execute, dispatch=dispatch, fence=fence))

    def _execute(self, tx: Transaction, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        ex = lock_execution(tx, dispatch.id)
        # The version may have risen (renewals); everything else must be the barrier's fence.
        if (
            ex.status != "executing"
            or ex.project_id != dispatch.project_id
            or ex.attempt_count != fence.attempt
            or ex.started_at_ms is None
            or ex.started_at_ms != fence.started_at_ms
            or ex.lease_owner != fence.owner
            or ex.lease_token_digest is None
            or not digest_equals(ex.lease_token_digest, lease_token_digest(fence.token))
            or ex.version < fence.version
        ):
            raise FenceConflict("the execution fence no longer holds", reason="stale_handler")
        existing = action_store.get_receipt(tx, dispatch.id)
        if existing is not None:
            if not _receipt_binds(existing, dispatch, ex):
                raise Conflict("the stored receipt does not match this dispatch")
            stored = existing.receipt
            return HandlerResult(
                outcome="succeeded", result_code=stored.result_code, result_digest=stored.evidence_digest()
            )
        plan, task = self._plan(tx, dispatch)
        if not digest_equals(plan.digest(), dispatch.action_digest):
            raise FenceConflict("the action digest drifted", reason="action_digest_mismatch")
        run, created = runs.create_run(
            tx,
            runs.CreateRun(
                project_id=dispatch.project_id,
                task=task,
                trigger_type="approved_action",
                idempotency_key=dispatch.id,
                priority=plan.priority,
                request_id=dispatch.approval_request_id,
                actor_type="system",
            ),
        )
        if not created:
            raise IdempotencyConflict("a run holds this dispatch's key without a receipt")
        now = tx.now_ms()
        receipt = RunActionReceipt(
            dispatch_id=dispatch.id,
            approval_request_id=dispatch.approval_request_id,
            project_id=dispatch.project_id,
            action_type=RUN_CREATE,
            action_digest=dispatch.action_digest,
            execution_attempt=ex.attempt_count,
            execution_version=ex.version,
            started_at_ms=ex.started_at_ms,
            idempotency_key=dispatch.id,
            outcome="succeeded",
            result_code=RUN_CREATE_RESULT_CODE,
            resource_type="run",
            resource_id=run.id,
            finished_at_ms=now,
            created_at_ms=now,
        )
        evidence = receipt.evidence_digest()
        action_store.insert_receipt(tx, receipt, evidence_digest=evidence)
        return HandlerResult(outcome="succeeded", result_code=RUN_CREATE_RESULT_CODE, result_digest=evidence)

    def probe(self, db: Database, dispatch: Dispatch, execution: Execution) -> Evidence:
        """Receipt-based evidence; never judged by the Run's final status."""
        try:
            return db.transaction(partial(self._probe, dispatch=dispatch, execution=execution), write=False)
        except Exception as exc:
            log.warning(
                "receipt probe failed", extra={"action": "action.probe_failed", "error": type(exc).__name__}
            )
            return Evidence(finding="unavailable")

    def _probe(self, tx: Transaction, dispatch: Dispatch, execution: Execution) -> Evidence:
        stored = action_store.get_receipt(tx, dispatch.id)
        if stored is None:
            collision = run_records.get_run_by_idempotency(tx, dispatch.project_id, dispatch.id)
            return Evidence(finding="conflict" if collision is not None else "missing")
        receipt = stored.receipt
        if not _receipt_binds(stored, dispatch, execution):
            return Evidence(finding="conflict")
        run = run_records.get_run_in_project(tx, dispatch.project_id, receipt.resource_id)
        if run is None:
            return Evidence(finding="conflict")
        try:
            plan = parse_run_create_plan(dispatch.action_plan)
        except ValidationFailed:
            return Evidence(finding="conflict")
        if not _run_binds(run, dispatch, plan):
            return Evidence(finding="conflict")
        return Evidence(
            finding="verified_succeeded",
            result_code=receipt.result_code,
            evidence_digest=receipt.evidence_digest(),
        )


def _run_binds(run: Run, dispatch: Dispatch, plan: RunCreatePlan) -> bool:
    return (
        run.project_id == dispatch.project_id
        and run.idempotency_key == dispatch.id
        and run.request_id == dispatch.approval_request_id
        and run.trigger_type == "approved_action"
        and run.task_id == plan.task_id
        and run.task_revision == plan.task_revision
        and run.priority == plan.priority
    )


def _receipt_binds(stored: StoredReceipt, dispatch: Dispatch, execution: Execution) -> bool:
    """Every bound field matches; the receipt's version may be lower than the snapshot, never higher."""
    receipt = stored.receipt
    return (
        receipt.schema_version == RECEIPT_SCHEMA_VERSION
        and receipt.dispatch_id == dispatch.id
        and receipt.approval_request_id == dispatch.approval_request_id
        and receipt.project_id == dispatch.project_id
        and receipt.action_type == dispatch.action_type == RUN_CREATE
        and receipt.action_digest == dispatch.action_digest
        and receipt.execution_attempt == execution.attempt_count
        and 1 <= receipt.execution_version <= execution.version
        and receipt.started_at_ms == execution.started_at_ms
        and receipt.idempotency_key == dispatch.id
        and receipt.outcome == "succeeded"
        and receipt.result_code == RUN_CREATE_RESULT_CODE
        and receipt.resource_type == "run"
        and receipt.finished_at_ms >= receipt.started_at_ms
        and receipt.created_at_ms == receipt.finished_at_ms
        and digest_equals(stored.evidence_digest, receipt.evidence_digest())
    )
