"""Builders for the approval and approved-action contract tests."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from ql3.application import approvals, approved_actions, auth
from ql3.application.approved_action_handlers import HandlerResult, RunCreateHandler
from ql3.application.approved_actions import ExecutionClaim
from ql3.domain.approvals import ApprovalRequest, Dispatch, ExecutionFence
from ql3.domain.auth import PrincipalKind
from ql3.domain.ids import new_id
from ql3.domain.model import Principal, Project, Task
from ql3.ports.storage import Database, Transaction
from tests.support.builders import seed_project, seed_task

HOUR = 3_600_000
LEASE_MS = 60_000


@dataclass
class World:
    """A project with a task that requires approval, a requester (operator) and an approver."""

    db: Any
    project: Project
    task: Task
    requester: Principal
    approver: Principal


def user(
    db: Any, project: Project, role: str, name: str | None = None, kind: PrincipalKind = "user"
) -> Principal:
    issued = db.transaction(
        lambda tx: auth.issue_token(
            tx, name=name or f"{role}-{new_id()[-8:]}", role=role, project=project, kind=kind
        )
    )
    principal: Principal = issued.principal
    return principal


def set_role(db: Any, principal: Principal, project: Project, role: str) -> None:
    db.transaction(
        lambda tx: tx.run(
            "binding_upsert", {"principal_id": principal.id, "project_id": project.id, "role": role}
        )
    )


def world(db: Any, *, task_name: str = "deploy", **spec: Any) -> World:
    project = seed_project(db)
    task = seed_task(db, project, name=task_name, approval="required", **spec)
    return World(
        db=db,
        project=project,
        task=task,
        requester=user(db, project, "operator", "requester"),
        approver=user(db, project, "approver", "approver"),
    )


def request(
    w: World, *, ttl_ms: int = HOUR, priority: int = 0, approval_id: str | None = None
) -> ApprovalRequest:
    result: ApprovalRequest = w.db.transaction(
        lambda tx: approvals.request_run_approval(
            tx,
            project_id=w.project.id,
            task_ref=w.task.name,
            requested_by=w.requester,
            ttl_ms=ttl_ms,
            priority=priority,
            approval_id=approval_id,
        )
    )
    return result


def decide(
    w: World,
    approval_id: str,
    *,
    decider: Principal | None = None,
    role: str = "approver",
    decision: str = "approve",
    decision_id: str | None = None,
    reason_code: str = "looks_good",
    note: str | None = None,
    db: Any = None,
) -> ApprovalRequest:
    result: ApprovalRequest = (db or w.db).transaction(
        lambda tx: approvals.decide(
            tx,
            approval_id=approval_id,
            project_id=w.project.id,
            decider=decider or w.approver,
            decider_role=role,
            decision=decision,
            decision_id=decision_id or new_id(),
            reason_code=reason_code,
            note=note,
        )
    )
    return result


def consume(w: World, approval_id: str, *, consumption_id: str | None = None, **kw: Any) -> Dispatch:
    result: Dispatch = w.db.transaction(
        lambda tx: approvals.consume(
            tx, approval_id=approval_id, consumption_id=consumption_id or new_id(), **kw
        )
    )
    return result


def approved(w: World, **kw: Any) -> ApprovalRequest:
    return decide(w, request(w, **kw).id)


def dispatched(w: World, **kw: Any) -> Dispatch:
    return consume(w, approved(w, **kw).id)


def token() -> str:
    return secrets.token_urlsafe(32)


def claim(
    db: Any, dispatch_id: str, *, owner: str = "replica-a", tok: str | None = None, **kw: Any
) -> ExecutionClaim:
    result: ExecutionClaim = db.transaction(
        lambda tx: approved_actions.claim(
            tx,
            dispatch_id=dispatch_id,
            owner=owner,
            token=tok or token(),
            lease_ms=kw.pop("lease_ms", LEASE_MS),
            **kw,
        )
    )
    return result


def leased(db: Any, dispatch_id: str, **kw: Any) -> ExecutionFence:
    result = claim(db, dispatch_id, **kw)
    assert result.outcome == "claimed" and result.fence is not None, result.outcome
    return result.fence


def started(db: Any, dispatch: Dispatch, **kw: Any) -> ExecutionFence:
    fence = leased(db, dispatch.id, **kw)
    result: ExecutionFence = db.transaction(
        lambda tx: approved_actions.start(
            tx, fence, approval_request_id=dispatch.approval_request_id, action_digest=dispatch.action_digest
        )
    )
    return result


def complete(db: Any, fence: ExecutionFence, **kw: Any) -> Any:
    kw.setdefault("mutation_id", new_id())
    return db.transaction(lambda tx: approved_actions.complete(tx, fence, **kw))


def execution(db: Any, dispatch_id: str) -> Any:
    return db.transaction(lambda tx: approved_actions.get_execution(tx, dispatch_id), write=False)


def action(db: Any, project: Project, dispatch_id: str) -> dict[str, Any]:
    result: dict[str, Any] = db.transaction(
        lambda tx: approved_actions.get_action(tx, project.id, dispatch_id), write=False
    )
    return result


def due_ids(db: Any, **kw: Any) -> list[str]:
    rows = db.transaction(lambda tx: approved_actions.due_page(tx, **kw), write=False)
    return [r.dispatch_id for r in rows]


def runs_for(db: Any, dispatch_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = db.raw("SELECT * FROM runs WHERE idempotency_key = ?", (dispatch_id,))
    return rows


def recovery_row(db: Any, dispatch_id: str) -> dict[str, Any] | None:
    rows = db.raw("SELECT * FROM approved_action_recovery WHERE dispatch_id = ?", (dispatch_id,))
    return rows[0] if rows else None


@dataclass
class CountingHandler:
    """Wraps a handler and counts calls; ``digest`` overrides what inspect reports (plan drift)."""

    inner: Any = field(default_factory=RunCreateHandler)
    digest: str | None = None
    explode: bool = False
    inspected: int = 0
    executed: int = 0

    @property
    def action_type(self) -> str:
        return str(self.inner.action_type)

    @property
    def recovery_mode(self) -> Any:
        return self.inner.recovery_mode

    def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
        self.inspected += 1
        real: str = self.inner.inspect(tx, dispatch)
        return self.digest or real

    def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        self.executed += 1
        if self.explode:
            raise RuntimeError("the downstream connection dropped")
        result: HandlerResult = self.inner.execute(db, dispatch, fence)
        return result

    def probe(self, db: Database, dispatch: Dispatch, execution: Any) -> Any:
        return self.inner.probe(db, dispatch, execution)


class ManualOnlyHandler:
    """A handler with no trusted evidence (like a shell action): recovery is manual only."""

    action_type = "run.create"
    recovery_mode = "manual_only"

    def __init__(self) -> None:
        self.executed = 0
        self.probed = 0

    def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
        return RunCreateHandler().inspect(tx, dispatch)

    def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        self.executed += 1
        return HandlerResult(outcome="failed", result_code="nothing_done")

    def probe(self, db: Database, dispatch: Dispatch, execution: Any) -> Any:
        self.probed += 1
        raise AssertionError("a manual-only handler is never probed")


def refuse_inserts(harness: Any, table: str) -> None:
    """Make every insert into ``table`` fail inside the writer's transaction (test-only DDL)."""
    assert table.isidentifier()
    if harness.dialect == "sqlite":
        harness.db.raw(
            f"CREATE TRIGGER {table}_inject_failure BEFORE INSERT ON {table}"
            " BEGIN SELECT RAISE(ABORT, 'injected'); END"
        )
    else:
        harness.db.raw(
            f"CREATE FUNCTION {table}_inject_failure() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = 'check_violation'; END $$"
        )
        harness.db.raw(
            f"CREATE TRIGGER {table}_inject_failure BEFORE INSERT ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION {table}_inject_failure()"
        )
