"""Tasks: create, list, show, edit (a new revision), enable, disable, delete, and start a run.

Who sees a task's command and working directory (docs/console.md): roles that may edit the task
(``task.write``: operator, admin) or decide its approvals (``approval.decide``: approver, admin). A
viewer sees ``command_visible: false`` and no text. The rule is applied here, not in the console.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from ql3.application import auth, run_queries, runs, schedules, task_revisions, tasks, workers
from ql3.domain.auth import role_allows
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.ids import is_id
from ql3.domain.model import Principal, Project
from ql3.domain.tasks import TaskSpec, build_spec, next_fire_ms, public_spec
from ql3.domain.timezones import local_iso
from ql3.domain.workers import effective_placement
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import (
    RunCreate,
    RunOut,
    SkippedOccurrenceOut,
    SkippedOccurrencePage,
    TaskCreate,
    TaskCreated,
    TaskEdit,
    TaskOut,
    TaskPage,
    run_row_out,
    task_out,
)
from ql3.http.routes.approvals import ApprovalRequested, request_approval
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/tasks", tags=["tasks"])
schedule_router = APIRouter(prefix="/api/v1/projects/{project}", tags=["tasks"])

COMMAND_READERS = ("task.write", "approval.decide")


NEXT_FIRES_SHOWN = 5


SKIPPED_SHOWN = 10


def _next_fires(task_id: str, spec: TaskSpec, first_occurrence_ms: int | None) -> list[int]:
    """When the cursor's occurrence and the few after it are due, as the scheduler will compute them
    (each with its seeded random delay)."""
    if spec.cron is None or first_occurrence_ms is None:
        return []
    occurrences = [first_occurrence_ms]
    for _ in range(NEXT_FIRES_SHOWN - 1):
        occurrences.append(next_fire_ms(spec.cron, occurrences[-1]))
    return [schedules.due_at(task_id, occurrence, spec) for occurrence in occurrences]


def may_see_command(tx: Transaction, principal: Principal, project: Project) -> bool:
    """The command visibility rule: the roles that may edit the task or approve what it runs."""
    role = auth.role_in(tx, principal, project)
    return role is not None and any(role_allows(role, p) for p in COMMAND_READERS)


class RevisionOut(BaseModel):
    revision: int
    content_digest: str
    created_at_ms: int
    spec: dict[str, Any]  # the public spec; with "command" and "cwd" only for those who may see them


class RevisionPage(BaseModel):
    items: list[RevisionOut]


@router.get("", response_model=TaskPage)
def list_tasks(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[
        str | None, Query(max_length=128, description="the last name of the previous page")
    ] = None,
    before: Annotated[
        str | None,
        Query(
            min_length=1, max_length=128, description="the first name of the next page: the page before it"
        ),
    ] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=tasks.MAX_SEARCH,
            description="names containing this (ASCII case ignored) or ids starting with it",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=tasks.MAX_TASK_PAGE)] = 50,
) -> TaskPage:
    """Live tasks in name order, a keyset page at a time: pass ``next_cursor`` back as ``cursor``
    for the next page, or ``prev_cursor`` as ``before`` for the previous one (docs/console.md
    "Paging and search")."""

    def unit(tx: Transaction) -> TaskPage:
        if cursor is not None and before is not None:
            raise ValidationFailed("cursor and before exclude each other", field="before")
        found = auth.authorize(tx, principal, project, "task.read")
        search = q or None
        views, more = tasks.list_tasks(
            tx, found.id, after=cursor or "", before=before, search=search, limit=limit
        )
        first, last = (views[0].task.name, views[-1].task.name) if views else (None, None)
        if before is not None:  # the page after this one is where ``before`` came from
            next_cursor, prev_cursor = last, first if more else None
        else:
            next_cursor, prev_cursor = last if more else None, first if cursor else None
        reveal = may_see_command(tx, principal, found)
        return TaskPage(
            items=[task_out(v, reveal=reveal) for v in views],
            next_cursor=next_cursor,
            prev_cursor=prev_cursor,
        )

    return db.transaction(unit, write=False)


class NextFireOut(BaseModel):
    task_id: str
    task_name: str
    next_fire_at_ms: int


class NextFirePage(BaseModel):
    items: list[NextFireOut]


@schedule_router.get("/next-fires", response_model=NextFirePage)
def list_next_fires(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=tasks.MAX_NEXT_FIRES)] = 10,
) -> NextFirePage:
    """The project's soonest cron fires (enabled tasks only), earliest first: the overview's card,
    read with one bounded query on the schedule index rather than from a page of tasks."""

    def unit(tx: Transaction) -> NextFirePage:
        found = auth.authorize(tx, principal, project, "task.read")
        return NextFirePage(
            items=[
                NextFireOut(task_id=f.task_id, task_name=f.task_name, next_fire_at_ms=f.next_fire_at_ms)
                for f in tasks.next_fires(tx, found.id, limit=limit)
            ]
        )

    return db.transaction(unit, write=False)


@router.post("", response_model=TaskCreated, status_code=status.HTTP_201_CREATED)
def create_task(project: str, body: TaskCreate, db: DbDep, principal: PrincipalDep) -> TaskCreated:
    def unit(tx: Transaction) -> TaskCreated:
        found = auth.authorize(tx, principal, project, "task.write")
        view = tasks.create_task(tx, found.id, body.name, body.spec(), enabled=body.enabled, tz=body.tz)
        return TaskCreated(
            **task_out(view, reveal=True).model_dump(), warnings=_placement_warnings(tx, view.spec)
        )

    return db.transaction(unit)


def _placement_warnings(tx: Transaction, spec: TaskSpec) -> list[str]:
    """A requirement that no registered worker meets is allowed (a worker may come later), but said."""
    if not spec.require:
        return []
    wanted = ",".join(f"{k}={v}" for k, v in sorted(spec.require.items()))
    try:
        placement = effective_placement(spec.executor, spec.require, spec.prefer)
    except ValidationFailed:
        return [f"--require {wanted} conflicts with the executor {spec.executor}: its runs never start"]
    if workers.requirement_met(tx, placement) is not False:
        return []
    return [f"no registered worker meets --require {wanted}: its runs wait until one does"]


@router.get("/{task}", response_model=TaskOut)
def show_task(project: str, task: str, db: DbDep, principal: PrincipalDep) -> TaskOut:
    def unit(tx: Transaction) -> TaskOut:
        found = auth.authorize(tx, principal, project, "task.read")
        reveal = may_see_command(tx, principal, found)
        found_view = tasks.view(tx, tasks.find_task(tx, found.id, task))
        out = task_out(found_view, reveal=reveal)
        task_id = found_view.task.id
        out.next_fires_at_ms = _next_fires(
            task_id, found_view.spec, schedules.next_occurrence_at(tx, task_id)
        )
        out.skipped_occurrences = _skipped(tx, task_id, SKIPPED_SHOWN)
        out.next_fires_local = [local_iso(ms, out.tz) for ms in out.next_fires_at_ms]
        return out

    return db.transaction(unit, write=False)


def _skipped(tx: Transaction, task_id: str, limit: int) -> list[SkippedOccurrenceOut]:
    found = schedules.list_skipped(tx, task_id, limit=limit)
    return [SkippedOccurrenceOut.model_validate(schedules.skipped_view(s)) for s in found]


@router.get("/{task}/skipped", response_model=SkippedOccurrencePage)
def list_skipped(
    project: str,
    task: str,
    db: DbDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=schedules.MAX_SKIP_PAGE)] = 50,
) -> SkippedOccurrencePage:
    """The task's cron occurrences that did not become runs, newest first, with their reason
    (``overlap``, ``misfire``, ``disabled``, ``deleted``); at most 100 records a task are kept."""

    def unit(tx: Transaction) -> SkippedOccurrencePage:
        found = auth.authorize(tx, principal, project, "task.read")
        return SkippedOccurrencePage(items=_skipped(tx, tasks.find_task(tx, found.id, task).id, limit))

    return db.transaction(unit, write=False)


@router.get("/{task}/revisions", response_model=RevisionPage)
def list_revisions(project: str, task: str, db: DbDep, principal: PrincipalDep) -> RevisionPage:
    """The task's latest revisions, newest first (at most 50), so a client can show what changed."""

    def unit(tx: Transaction) -> RevisionPage:
        found = auth.authorize(tx, principal, project, "task.read")
        reveal = may_see_command(tx, principal, found)
        found_task = tasks.find_task(tx, found.id, task)
        items = []
        for rev in task_revisions.list_revisions(tx, found_task.id):
            spec = build_spec(rev.spec)
            shown = public_spec(spec) | ({"command": spec.command, "cwd": spec.cwd} if reveal else {})
            items.append(
                RevisionOut(
                    revision=rev.revision,
                    content_digest=rev.content_digest,
                    created_at_ms=rev.created_at_ms,
                    spec=shown,
                )
            )
        return RevisionPage(items=items)

    return db.transaction(unit, write=False)


@router.patch("/{task}", response_model=TaskOut)
def edit_task(project: str, task: str, body: TaskEdit, db: DbDep, principal: PrincipalDep) -> TaskOut:
    """Publish a new revision; an edit that changes nothing returns the current one."""

    def unit(tx: Transaction) -> TaskOut:
        found = auth.authorize(tx, principal, project, "task.write")
        return task_out(tasks.edit_task(tx, found.id, task, body.changes(), tz=body.tz), reveal=True)

    return db.transaction(unit)


def _set_enabled(db: DbDep, principal: PrincipalDep, project: str, task: str, enabled: bool) -> TaskOut:
    def unit(tx: Transaction) -> TaskOut:
        found = auth.authorize(tx, principal, project, "task.write")
        return task_out(tasks.set_enabled(tx, found.id, task, enabled), reveal=True)

    return db.transaction(unit)


@router.post("/{task}/enable", response_model=TaskOut)
def enable_task(project: str, task: str, db: DbDep, principal: PrincipalDep) -> TaskOut:
    return _set_enabled(db, principal, project, task, True)


@router.post("/{task}/disable", response_model=TaskOut)
def disable_task(project: str, task: str, db: DbDep, principal: PrincipalDep) -> TaskOut:
    return _set_enabled(db, principal, project, task, False)


@router.delete("/{task}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def delete_task(project: str, task: str, db: DbDep, principal: PrincipalDep) -> Response:
    def unit(tx: Transaction) -> None:
        found = auth.authorize(tx, principal, project, "task.write")
        tasks.delete_task(tx, found.id, task)

    db.transaction(unit)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{task}/runs",
    response_model=RunOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": RunOut, "description": "an idempotent repeat: the existing run"},
        202: {"model": ApprovalRequested, "description": "approval required: a request, no run"},
    },
)
async def start_run(
    project: str,
    task: str,
    db: DbDep,
    principal: PrincipalDep,
    response: Response,
    body: RunCreate | None = None,
) -> RunOut | JSONResponse:
    """Queue a run of the task's current revision: 201 for a new run, 200 when ``idempotency_key``
    names a run this project already has for the same request (409 ``idempotency_conflict`` when the
    key was used with another task, priority or ``rerun_of``; keys under ``ql3:`` are the server's
    own, 422 ``reserved_idempotency_key``). A task with ``approval: required`` gets
    no run but an approval request (202 ``{"approval": ...}``); the run exists once it is approved."""
    request = body or RunCreate()

    def unit(tx: Transaction) -> tuple[RunOut, bool] | ApprovalRequested:
        return start_run_in(tx, principal, project, task, request)

    # Async, with the unit alone in the thread pool: FastAPI validates the response of a plain ``def``
    # route in the thread pool too, one more thread hand-off per request (bench/README.md, 2026-12-02).
    result = await run_in_threadpool(db.transaction, unit)
    if isinstance(result, ApprovalRequested):
        return JSONResponse(result.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED)
    out, created = result
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return out


def start_run_in(
    tx: Transaction, principal: Principal, project: str, task: str, request: RunCreate
) -> tuple[RunOut, bool] | ApprovalRequested:
    """The create unit of ``POST .../tasks/{task}/runs`` for an authenticated ``principal``: the run
    and whether it is new, or the approval request standing in for it. Shared by the route and the
    fast path in front of the framework (ql3/http/run_intake.py)."""
    # The project, the caller's role there, the task and its current revision: one read.
    access = auth.authorize_task(tx, principal, project, task, "run.create")
    found, found_task = access.project, access.task
    key = runs.validate_idempotency_key(request.idempotency_key)
    # Validated before the approval branch too: bad input is refused whichever path it takes.
    rerun_of = _rerun_of(tx, found.id, found_task.id, request.rerun_of)
    # The current revision, read once: its approval rule here, its retry policy in create_run and
    # its placement for the waiting reason below.
    if access.revision is None:
        raise NotFound("task revision not found")
    spec = build_spec(access.revision.spec)
    if spec.approval == "required":
        return request_approval(
            tx, found, found_task, principal, priority=request.priority, idempotency_key=key
        )
    cmd = runs.CreateRun(
        project_id=found.id,
        task=found_task,
        spec=spec,
        idempotency_key=key,
        priority=request.priority,
        retry_of_run_id=rerun_of,
        actor_type="user",
        actor_id=principal.id,
    )
    run, created = runs.create_run(tx, cmd)
    reasons = workers.WaitingReasons(tx)
    reasons.know_revision(found_task.id, found_task.revision, spec)
    return run_row_out(run_queries.describe(tx, run), reasons.reason(run)), created


def _rerun_of(tx: Transaction, project_id: str, task_id: str, ref: str | None) -> str | None:
    """A re-run names an earlier run of the same task in this project; anything else is refused."""
    if ref is None:
        return None
    if not isinstance(ref, str) or not is_id(ref):
        raise ValidationFailed("rerun_of is not a run id", field="rerun_of")
    try:
        earlier = runs.get_run(tx, project_id, ref)
    except NotFound as exc:
        raise ValidationFailed("rerun_of names no run of this project", field="rerun_of") from exc
    if earlier.task_id != task_id:
        raise ValidationFailed("rerun_of names a run of another task", field="rerun_of")
    return earlier.id
