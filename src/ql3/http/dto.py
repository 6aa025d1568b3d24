"""Request and response shapes of the HTTP API.

Requests are strict (no type coercion) and refuse unknown fields; the domain then validates the
values. Responses are built only from public facts: a task shows ``public_spec`` and never its
command, working directory or env values.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from ql3.application.auth import MAX_EXPIRES_IN_S, MIN_EXPIRES_IN_S, IssuedToken
from ql3.application.run_queries import RunRow, trigger_of
from ql3.application.tasks import TaskView
from ql3.domain.ids import UUID_PATTERN
from ql3.domain.model import Project, Run, RunEvent
from ql3.domain.tasks import MAX_TASK_NAME_CHARS, NAME_RE, TASK_NAME_RE, public_spec

# -- requests -------------------------------------------------------------------------------------

# Rules the domain enforces, stated in the OpenAPI document only (the domain stays the one validator,
# so its 422s keep their ``details.field``). A rule JSON Schema cannot state (cron syntax...) is named
# in the 422 description instead.
NAME_SCHEMA: Final[dict[str, Any]] = {"pattern": NAME_RE.pattern}
TASK_NAME_SCHEMA: Final[dict[str, Any]] = {"pattern": TASK_NAME_RE.pattern, "maxLength": MAX_TASK_NAME_CHARS}
COMMAND_SCHEMA: Final[dict[str, Any]] = {"pattern": r"\S"}


def integer_schema(minimum: int, maximum: int) -> WithJsonSchema:
    """An integer's range in the document (on the integer itself, not beside a ``null`` branch)."""
    return WithJsonSchema({"type": "integer", "minimum": minimum, "maximum": maximum})


ExpiresIn = Annotated[int, integer_schema(MIN_EXPIRES_IN_S, MAX_EXPIRES_IN_S)]


MAX_EXACT_INTEGER: Final = 2**53


def _integral_floats_to_int(data: Any) -> Any:
    """JSON has one number type: ``5.0`` is the integer 5 (as JSON Schema says), so a number without
    a fraction is handed to the strict models as an int. Strings and booleans are never coerced.
    Iterative, in place on the freshly decoded body."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        for key, item in list(items):
            if isinstance(item, float) and item.is_integer() and abs(item) <= MAX_EXACT_INTEGER:
                value[key] = int(item)
            elif isinstance(item, dict | list):
                stack.append(item)
    return data


def _has_lone_surrogate(data: Any) -> bool:
    """Whether any string in a decoded JSON value (keys included) cannot be encoded as UTF-8.

    JSON's ``\\ud800`` escapes decode to lone UTF-16 surrogates, which no database or file takes.
    Iterative, so a deeply nested body cannot exhaust the stack.
    """
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        # Every client string must be valid Unicode text: refused with 422 before anything is written.
        if _has_lone_surrogate(data):
            raise ValueError("text must be valid UTF-8")
        return _integral_floats_to_int(data)


class PreferenceIn(Body):
    labels: dict[str, str]
    weight: int = 1


class TaskSpecFields(Body):
    cron: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    environment_policy: Literal["inherit", "isolated"] | None = None
    timeout_ms: int | None = None
    grace_ms: int | None = None
    require: dict[str, str] | None = None
    prefer: list[PreferenceIn] | None = None
    overlap: Literal["allow", "skip", "cancel_previous"] | None = None
    approval: Literal["none", "required"] | None = None
    max_attempts: int | None = None
    retry_safe: bool | None = None
    misfire: Literal["skip", "fire_once"] | None = None
    misfire_grace_ms: int | None = None
    random_delay_ms: int | None = None
    on_start: bool | None = None
    # The zone the cron is evaluated in (an IANA name); stored as the cron's CRON_TZ= prefix.
    tz: str | None = Field(default=None, json_schema_extra={"minLength": 1, "maxLength": 64})

    script: str | None = Field(
        default=None, max_length=255, description="a project script's path (docs/scripts.md)"
    )


class TaskCreate(TaskSpecFields):
    name: str = Field(json_schema_extra=TASK_NAME_SCHEMA)
    command: str | None = Field(
        default=None,
        json_schema_extra=COMMAND_SCHEMA,
        description="required unless script is given (then the script's interpreter runs it)",
    )
    enabled: bool = True

    def spec(self) -> dict[str, Any]:
        """The raw spec for ``build_spec``: only what the client sent, defaults left to the domain."""
        return self.model_dump(exclude_unset=True, exclude_none=True, exclude={"name", "enabled", "tz"})


class TaskEdit(TaskSpecFields):
    command: str | None = Field(default=None, json_schema_extra=COMMAND_SCHEMA)

    def changes(self) -> dict[str, Any]:
        """Fields the client sent; an explicit null clears an optional field (cron, cwd, env...)."""
        return self.model_dump(exclude_unset=True, exclude={"tz"})


class RunCreate(Body):
    idempotency_key: str | None = Field(
        default=None, json_schema_extra={"minLength": 1, "maxLength": 255, "pattern": r"^[^\x00-\x1f]*$"}
    )
    priority: int = 0
    # an earlier run of the same task this one repeats (trigger "retry")
    rerun_of: str | None = Field(default=None, json_schema_extra={"pattern": UUID_PATTERN})


class ProjectCreate(Body):
    name: str = Field(json_schema_extra=NAME_SCHEMA)


class TokenCreate(Body):
    role: Literal["viewer", "operator", "approver", "admin", "metrics"]
    name: str = Field(default="token", json_schema_extra=NAME_SCHEMA)
    # 60 s to 10 years; without it the token never expires
    expires_in_s: ExpiresIn | None = None


class TokenRotate(Body):
    # without it a token with a lifetime gets the same one again
    expires_in_s: ExpiresIn | None = None


# -- responses ------------------------------------------------------------------------------------


class PreferenceOut(BaseModel):
    labels: dict[str, str]
    weight: int


class SkippedOccurrenceOut(BaseModel):
    """Cron occurrences that did not become runs: one, or a range skipped together for one reason."""

    occurrence_ms: int
    last_occurrence_ms: int
    occurrences: int
    reason: str  # overlap | misfire | disabled | deleted
    task_revision: int
    recorded_at_ms: int


class SkippedOccurrencePage(BaseModel):
    items: list[SkippedOccurrenceOut]


class TaskOut(BaseModel):
    id: str
    project_id: str
    name: str
    revision: int
    enabled: bool
    content_digest: str
    created_at_ms: int
    updated_at_ms: int
    cron: str | None
    tz: str  # the zone the cron is evaluated in (UTC without a CRON_TZ= prefix)
    env_keys: list[str]
    has_cwd: bool
    environment_policy: str
    timeout_ms: int | None
    grace_ms: int
    require: dict[str, str]
    prefer: list[PreferenceOut]
    overlap: str
    approval: str
    max_attempts: int
    retry_safe: bool
    executor: str
    misfire: str
    misfire_grace_ms: int = 300_000
    random_delay_ms: int = 0
    on_start: bool = False
    script: str | None = None
    next_fire_at_ms: int | None
    next_fires_at_ms: list[int] = []  # on a task's own page: the next few fires, random delay included
    next_fires_local: list[str] = []  # the same instants as wall time in the task's zone (ISO 8601)
    # On a task's own page: its latest skipped cron occurrences, newest first (docs/cron.md).
    skipped_occurrences: list[SkippedOccurrenceOut] = []
    # Shown only to roles that may edit the task or decide its approvals (docs/console.md).
    command_visible: bool = False
    command: str | None = None
    cwd: str | None = None


class TaskCreated(TaskOut):
    """A new task, with warnings about what will keep its runs waiting (it is created anyway)."""

    warnings: list[str] = []


class TaskPage(BaseModel):
    items: list[TaskOut]
    next_cursor: str | None
    prev_cursor: str | None = None  # pass as ``before`` for the previous page; null on the first


class DispatchReasonOut(BaseModel):
    """One reason the dispatcher gave for not placing a run (``scope`` ``run``), or for stopping a
    whole cycle while the run waited (``scope`` ``cycle``)."""

    reason: str
    scope: Literal["run", "cycle"]
    first_seen_at_ms: int
    last_seen_at_ms: int
    count: int


class RunOut(BaseModel):
    id: str
    project_id: str
    task_id: str
    task_revision: int
    status: str
    trigger_type: str
    version: int
    priority: int
    idempotency_key: str | None
    created_at_ms: int
    queued_at_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    scheduled_for_ms: int | None
    exit_code: int | None
    error_code: str | None
    cancel_requested_at_ms: int | None
    cancel_reason: str | None
    task_name: str | None = None
    trigger: str = "manual"  # manual | cron | approval | retry (a re-run of an earlier run)
    attempt: int | None = None  # the latest attempt's number; null before the first claim
    # Why a queued run is not running yet (docs/dispatch.md); null when it is not queued.
    waiting_reason: str | None = None
    # What this server's dispatcher said about the run while it could not place it, most recently seen
    # first (docs/dispatch.md, "What the dispatcher saw"): on the run's own resource only, null in lists
    # and on a server that runs no dispatcher.
    dispatch_reasons: list[DispatchReasonOut] | None = None


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None


class EventOut(BaseModel):
    id: str
    run_id: str
    sequence: int
    type: str
    actor_type: str
    actor_id: str | None
    attempt_id: str | None
    payload: dict[str, Any]
    created_at_ms: int


class EventPage(BaseModel):
    items: list[EventOut]
    next_after: int | None


class LogPage(BaseModel):
    """One page of an attempt's log, the bytes [offset, next_offset); ask again with
    ``offset=next_offset`` (forwards) or ``before=offset`` (backwards)."""

    attempt: int | None
    offset: int
    next_offset: int
    data: str
    eof: bool
    complete: bool
    size: int  # the log's length in bytes when the page was read


class LogMatch(BaseModel):
    offset: int  # the byte offset where the match starts
    length: int  # its length in bytes


class LogSearchPage(BaseModel):
    """Matches of a search of an attempt's log; ``next_cursor`` (not null) is where to go on from,
    as ``after`` (forwards) or ``before`` (backwards): the scan stopped at its bound or its limit."""

    attempt: int | None
    matches: list[LogMatch]
    next_cursor: int | None
    scanned_bytes: int
    size: int


class WorkerOut(BaseModel):
    id: str
    status: str
    generation: int
    slots: int
    busy: int
    max_concurrent_runs: int
    active_runs: int
    labels: dict[str, str]
    executors: list[str]
    last_heartbeat_at_ms: int


class WorkerPage(BaseModel):
    items: list[WorkerOut]
    next_after: str | None


class ProjectOut(BaseModel):
    id: str
    name: str
    version: int
    created_at_ms: int
    role: str | None = None


class ProjectPage(BaseModel):
    items: list[ProjectOut]
    next_cursor: str | None


class TokenOut(BaseModel):
    token: str
    principal_id: str
    name: str
    role: str
    project_id: str
    project: str
    expires_at_ms: int | None = None


class Status(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorOut(BaseModel):
    """Every error: a stable machine-readable ``code`` and a fixed human ``message``."""

    error: ErrorDetail


# -- mapping --------------------------------------------------------------------------------------


def task_out(view: TaskView, *, reveal: bool = False) -> TaskOut:
    """``reveal`` adds the command and working directory, for roles allowed to see them."""
    task = view.task
    secret: dict[str, Any] = (
        {"command_visible": True, "command": view.spec.command, "cwd": view.spec.cwd} if reveal else {}
    )
    return TaskOut(
        id=task.id,
        project_id=task.project_id,
        name=task.name,
        revision=task.revision,
        enabled=task.enabled,
        content_digest=view.revision.content_digest,
        created_at_ms=task.created_at_ms,
        updated_at_ms=task.updated_at_ms,
        next_fire_at_ms=view.next_fire_at_ms,
        **public_spec(view.spec),
        **secret,
    )


def run_out(
    run: Run,
    *,
    task_name: str | None = None,
    trigger: str | None = None,
    attempt: int | None = None,
    waiting_reason: str | None = None,
) -> RunOut:
    """``waiting_reason``: as computed by ``workers.WaitingReasons``; a queued run without one is
    ``queued`` (just queued, not yet examined)."""
    return RunOut(
        id=run.id,
        project_id=run.project_id,
        task_id=run.task_id,
        task_revision=run.task_revision,
        status=run.status,
        trigger_type=run.trigger_type,
        version=run.version,
        priority=run.priority,
        idempotency_key=run.idempotency_key,
        created_at_ms=run.created_at_ms,
        queued_at_ms=run.queued_at_ms,
        started_at_ms=run.started_at_ms,
        finished_at_ms=run.finished_at_ms,
        scheduled_for_ms=run.scheduled_for_ms,
        exit_code=run.exit_code,
        error_code=run.error_code,
        cancel_requested_at_ms=run.cancel_requested_at_ms,
        cancel_reason=run.cancel_reason,
        task_name=task_name,
        trigger=trigger or trigger_of(run),
        attempt=attempt,
        waiting_reason=(waiting_reason or "queued") if run.status == "queued" else None,
    )


def run_row_out(row: RunRow, waiting_reason: str | None = None) -> RunOut:
    return run_out(
        row.run,
        task_name=row.task_name,
        trigger=row.trigger,
        attempt=row.attempt,
        waiting_reason=waiting_reason,
    )


def event_out(event: RunEvent) -> EventOut:
    return EventOut(
        id=event.id,
        run_id=event.run_id,
        sequence=event.sequence,
        type=event.type,
        actor_type=event.actor_type,
        actor_id=event.actor_id,
        attempt_id=event.attempt_id,
        payload=dict(event.payload),
        created_at_ms=event.created_at_ms,
    )


def project_out(project: Project, role: str | None = None) -> ProjectOut:
    return ProjectOut(
        id=project.id,
        name=project.name,
        version=project.version,
        created_at_ms=project.created_at_ms,
        role=role,
    )


def token_out(issued: IssuedToken) -> TokenOut:
    return TokenOut(
        token=issued.token,
        principal_id=issued.principal.id,
        name=issued.principal.name,
        role=issued.role,
        project_id=issued.project.id,
        project=issued.project.name,
        expires_at_ms=issued.expires_at_ms,
    )


class ParkedItemOut(BaseModel):
    """An item a control loop parked (docs/operations.md "Parked items"): ids, a stable reason code
    and times only, never an error message."""

    loop: str
    item_kind: str
    item_key: str
    project_id: str | None
    reason: str
    error_type: str | None
    failures: int
    first_failed_at_ms: int
    last_failed_at_ms: int
    next_retry_at_ms: int


class ParkedItemPage(BaseModel):
    items: list[ParkedItemOut]
    truncated: bool
