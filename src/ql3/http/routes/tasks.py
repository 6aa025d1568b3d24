"""Tasks: create, list, show, edit (a new revision), enable, disable, delete, and start a run."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import JSONResponse

from ql3.application import auth, runs, tasks, workers
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import TaskSpec
from ql3.domain.workers import effective_placement
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import (
    RunCreate,
    RunOut,
    TaskCreate,
    TaskCreated,
    TaskEdit,
    TaskOut,
    TaskPage,
    run_out,
    task_out,
)
from ql3.http.routes.approvals import ApprovalRequested, request_approval
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/tasks", tags=["tasks"])


@router.get("", response_model=TaskPage)
def list_tasks(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[
        str | None, Query(max_length=128, description="the last name of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=tasks.MAX_TASK_PAGE)] = 50,
) -> TaskPage:
    def unit(tx: Transaction) -> TaskPage:
        found = auth.authorize(tx, principal, project, "task.read")
        views = tasks.list_tasks(tx, found.id, after=cursor or "", limit=limit)
        next_cursor = views[-1].task.name if len(views) == limit else None
        return TaskPage(items=[task_out(v) for v in views], next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.post("", response_model=TaskCreated, status_code=status.HTTP_201_CREATED)
def create_task(project: str, body: TaskCreate, db: DbDep, principal: PrincipalDep) -> TaskCreated:
    def unit(tx: Transaction) -> TaskCreated:
        found = auth.authorize(tx, principal, project, "task.write")
        view = tasks.create_task(tx, found.id, body.name, body.spec(), enabled=body.enabled)
        return TaskCreated(**task_out(view).model_dump(), warnings=_placement_warnings(tx, view.spec))

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
        return task_out(tasks.view(tx, tasks.find_task(tx, found.id, task)))

    return db.transaction(unit, write=False)


@router.patch("/{task}", response_model=TaskOut)
def edit_task(project: str, task: str, body: TaskEdit, db: DbDep, principal: PrincipalDep) -> TaskOut:
    """Publish a new revision; an edit that changes nothing returns the current one."""

    def unit(tx: Transaction) -> TaskOut:
        found = auth.authorize(tx, principal, project, "task.write")
        return task_out(tasks.edit_task(tx, found.id, task, body.changes()))

    return db.transaction(unit)


def _set_enabled(db: DbDep, principal: PrincipalDep, project: str, task: str, enabled: bool) -> TaskOut:
    def unit(tx: Transaction) -> TaskOut:
        found = auth.authorize(tx, principal, project, "task.write")
        return task_out(tasks.set_enabled(tx, found.id, task, enabled))

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
def start_run(
    project: str,
    task: str,
    db: DbDep,
    principal: PrincipalDep,
    response: Response,
    body: RunCreate | None = None,
) -> RunOut | JSONResponse:
    """Queue a run of the task's current revision: 201 for a new run, 200 when ``idempotency_key``
    names a run this project already has for the same task. A task with ``approval: required`` gets
    no run but an approval request (202 ``{"approval": ...}``); the run exists once it is approved."""
    request = body or RunCreate()

    def unit(tx: Transaction) -> tuple[RunOut, bool] | ApprovalRequested:
        found = auth.authorize(tx, principal, project, "run.create")
        found_task = tasks.find_task(tx, found.id, task)
        key = runs.validate_idempotency_key(request.idempotency_key)
        if tasks.view(tx, found_task).spec.approval == "required":
            return request_approval(
                tx, found, found_task, principal, priority=request.priority, idempotency_key=key
            )
        cmd = runs.CreateRun(
            project_id=found.id,
            task=found_task,
            idempotency_key=key,
            priority=request.priority,
            actor_type="user",
            actor_id=principal.id,
        )
        run, created = runs.create_run(tx, cmd)
        return run_out(run, workers.WaitingReasons(tx).reason(run)), created

    result = db.transaction(unit)
    if isinstance(result, ApprovalRequested):
        return JSONResponse(result.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED)
    out, created = result
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return out
