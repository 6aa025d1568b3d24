"""Runs: keyset-paginated list, show, and the event log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ql3.application import auth, runs, tasks
from ql3.domain.errors import NotFound
from ql3.domain.ids import is_id
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import EventPage, RunOut, RunPage, event_out, run_out
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/runs", tags=["runs"])

MAX_EVENT_PAGE = 500


def _run_id(run_id: str) -> str:
    if not is_id(run_id):
        raise NotFound("run not found")
    return run_id


@router.get("", response_model=RunPage)
def list_runs(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    task: Annotated[str | None, Query(max_length=128, description="a task name or id")] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=runs.MAX_PAGE)] = runs.DEFAULT_PAGE,
) -> RunPage:
    """Newest first; pass ``next_cursor`` back as ``cursor`` for the next page."""

    def unit(tx: Transaction) -> RunPage:
        found = auth.authorize(tx, principal, project, "run.read")
        task_id = tasks.find_task(tx, found.id, task).id if task else None
        page, next_cursor = runs.list_runs(tx, found.id, task_id=task_id, cursor=cursor, limit=limit)
        return RunPage(items=[run_out(r) for r in page], next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.get("/{run_id}", response_model=RunOut)
def show_run(project: str, run_id: str, db: DbDep, principal: PrincipalDep) -> RunOut:
    def unit(tx: Transaction) -> RunOut:
        found = auth.authorize(tx, principal, project, "run.read")
        return run_out(runs.get_run(tx, found.id, _run_id(run_id)))

    return db.transaction(unit, write=False)


@router.get("/{run_id}/events", response_model=EventPage)
def list_events(
    project: str,
    run_id: str,
    db: DbDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=2**62, description="the last sequence already seen")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENT_PAGE)] = 100,
) -> EventPage:
    def unit(tx: Transaction) -> EventPage:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        events = runs.list_events(tx, run.id, after=after, limit=limit)
        next_after = events[-1].sequence if len(events) == limit else None
        return EventPage(items=[event_out(e) for e in events], next_after=next_after)

    return db.transaction(unit, write=False)
