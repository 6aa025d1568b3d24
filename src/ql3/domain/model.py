"""Immutable records. Row mapping lives in the storage adapters, not here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ql3.domain.auth import PrincipalKind, Role


@dataclass(frozen=True, slots=True, kw_only=True)
class Project:
    id: str
    name: str
    version: int
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    id: str
    project_id: str
    name: str
    enabled: bool
    revision: int
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRevision:
    task_id: str
    revision: int
    spec: dict[str, Any]
    content_digest: str
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSchedule:
    """A task's cron cursor (docs/cron.md): the expression it follows, the occurrence it waits for
    (``next_occurrence_ms``) and when that occurrence is due (``next_fire_at_ms``: the occurrence plus
    its random delay; None while the task is disabled, the cursor then kept for the skip record)."""

    task_id: str
    project_id: str
    task_revision: int
    cron_expr: str
    next_fire_at_ms: int | None
    last_scheduled_at_ms: int | None
    state_version: int
    updated_at_ms: int
    next_occurrence_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    id: str
    project_id: str
    task_id: str
    task_revision: int
    trigger_type: str
    status: str
    version: int
    event_sequence: int
    priority: int
    idempotency_key: str | None
    created_at_ms: int
    queued_at_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    cancel_requested_at_ms: int | None
    cancel_reason: str | None
    error_code: str | None
    exit_code: int | None
    scheduled_for_ms: int | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    id: str
    run_id: str
    attempt: int
    status: str
    executor_type: str
    worker_id: str | None
    pid: int | None
    executor_handle: str | None
    log_artifact_id: str | None
    deadline_at_ms: int | None
    callback_token_hash: str | None
    callback_sequence: int
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    exit_code: int | None
    error_code: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEvent:
    id: str
    run_id: str
    sequence: int
    type: str
    actor_type: str
    actor_id: str | None
    attempt_id: str | None
    payload: dict[str, Any] = field(default_factory=dict)
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    id: str
    name: str
    kind: PrincipalKind
    is_owner: bool
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleBinding:
    principal_id: str
    project_id: str
    role: Role
    version: int
