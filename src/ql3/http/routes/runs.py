"""Runs: keyset-paginated list, show, the event log and the attempt's log."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from ql3.application import auth, rows, run_queries, runs, tasks, workers
from ql3.domain.errors import NotFound
from ql3.domain.ids import is_id
from ql3.domain.model import Attempt
from ql3.domain.states import is_run_terminal
from ql3.http import logs
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import EventPage, LogPage, RunOut, RunPage, event_out, run_row_out
from ql3.ports.storage import Transaction

# The status filter as the OpenAPI document states it: known statuses, comma-separated.
_ONE_STATUS = f" *({'|'.join(run_queries.RUN_STATUSES)}) *"
_STATUS_LIST = f"^{_ONE_STATUS}(,{_ONE_STATUS})*$"

router = APIRouter(prefix="/api/v1/projects/{project}/runs", tags=["runs"])

MAX_EVENT_PAGE = 500
MAX_ATTEMPTS_LISTED = 64  # what the attempt_list query returns at most


def get_logs_root(request: Request) -> Path | None:
    root: Path | None = getattr(request.app.state, "logs_root", None)
    return root


LogsRootDep = Annotated[Path | None, Depends(get_logs_root)]


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
    status: Annotated[
        str | None,
        Query(
            max_length=200,
            description="comma-separated run statuses, e.g. failed,timed_out",
            json_schema_extra={"pattern": _STATUS_LIST},
        ),
    ] = None,
    trigger: Annotated[
        str | None,
        Query(
            max_length=16,
            description="manual, cron, approval or retry (a re-run)",
            json_schema_extra={"enum": list(run_queries.TRIGGERS)},
        ),
    ] = None,
    since: Annotated[
        int | None, Query(ge=0, le=run_queries.MAX_TIME_MS, description="created at or after (epoch ms)")
    ] = None,
    until: Annotated[
        int | None, Query(ge=0, le=run_queries.MAX_TIME_MS, description="created before (epoch ms)")
    ] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=runs.MAX_PAGE)] = runs.DEFAULT_PAGE,
) -> RunPage:
    """Newest first; pass ``next_cursor`` back as ``cursor`` with the same filters for the next page.
    An unknown status or trigger is refused (422 ``validation_failed``), never ignored."""

    def unit(tx: Transaction) -> RunPage:
        found = auth.authorize(tx, principal, project, "run.read")
        flt = run_queries.RunFilter(
            statuses=run_queries.parse_statuses(status),
            trigger=trigger,
            since_ms=since,
            until_ms=until,
        )
        run_queries.validate_filter(flt)  # a bad value is refused before the task is looked up
        if task:
            flt = replace(flt, task_id=tasks.find_task(tx, found.id, task).id)
        page, next_cursor = run_queries.list_filtered(tx, found.id, flt, cursor=cursor, limit=limit)
        waiting = workers.WaitingReasons(tx)
        items = [run_row_out(r, waiting.reason(r.run)) for r in page]
        return RunPage(items=items, next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.get("/{run_id}", response_model=RunOut)
def show_run(project: str, run_id: str, db: DbDep, principal: PrincipalDep) -> RunOut:
    def unit(tx: Transaction) -> RunOut:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        return run_row_out(run_queries.describe(tx, run), workers.WaitingReasons(tx).reason(run))

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


def _attempt(tx: Transaction, run_id: str, number: int | None) -> Attempt | None:
    if number is None:
        return runs.latest_attempt(tx, run_id)
    for row in tx.all("attempt_list", {"run_id": run_id}):
        if int(row["attempt"]) == number:
            return rows.attempt(row)
    raise NotFound("attempt not found")


@router.get("/{run_id}/logs", response_model=LogPage)
def read_logs(
    project: str,
    run_id: str,
    db: DbDep,
    principal: PrincipalDep,
    logs_root: LogsRootDep,
    offset: Annotated[int, Query(ge=0, le=2**62, description="the next_offset of the previous page")] = 0,
    max_bytes: Annotated[int, Query(ge=1, le=logs.MAX_LOG_PAGE)] = logs.DEFAULT_LOG_PAGE,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPTS_LISTED, description="default: the latest attempt")
    ] = None,
) -> LogPage:
    """A page of the attempt's output (UTF-8, invalid bytes replaced). Poll with ``offset=next_offset``;
    ``complete`` means the run is terminal and no more bytes follow."""

    def unit(tx: Transaction) -> tuple[bool, Attempt | None]:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        return is_run_terminal(run.status), _attempt(tx, run.id, attempt)

    # The status is read before the file: when the run was terminal then, the log was already whole.
    terminal, chosen = db.transaction(unit, write=False)
    if logs_root is None:
        raise logs.LogsUnavailable()
    if chosen is None:
        return LogPage(attempt=None, offset=offset, next_offset=offset, data="", eof=True, complete=terminal)
    chunk = logs.read_chunk(logs_root, chosen.log_artifact_id or chosen.id, offset, max_bytes)
    text, next_offset = logs.split_text(chunk, final=terminal and chunk.eof)
    return LogPage(
        attempt=chosen.attempt,
        offset=offset,
        next_offset=next_offset,
        data=text,
        eof=chunk.eof,  # a character still being written is held back, but nothing else follows yet
        complete=terminal and chunk.eof,  # a terminal run's last page is never held back
    )


MAX_RAW_LOG_PAGES = 4096  # 1 GiB at the largest page: a bound on one download, far above any real log


@router.get(
    "/{run_id}/logs/raw",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "the attempt's whole log"}},
)
def read_raw_log(
    project: str,
    run_id: str,
    db: DbDep,
    principal: PrincipalDep,
    logs_root: LogsRootDep,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPTS_LISTED, description="default: the latest attempt")
    ] = None,
) -> StreamingResponse:
    """The attempt's whole log as written so far, as a ``text/plain`` download (bytes as written)."""

    def unit(tx: Transaction) -> tuple[str, Attempt | None]:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        return run.id, _attempt(tx, run.id, attempt)

    found_id, chosen = db.transaction(unit, write=False)
    if logs_root is None:
        raise logs.LogsUnavailable()
    root = logs_root
    artifact = chosen.log_artifact_id or chosen.id if chosen is not None else None
    first = logs.read_chunk(root, artifact, 0, logs.MAX_LOG_PAGE) if artifact else None

    def body() -> Iterator[bytes]:
        chunk = first
        for _ in range(MAX_RAW_LOG_PAGES):
            if chunk is None or not chunk.data:
                return
            yield chunk.data
            if chunk.eof or artifact is None:
                return
            chunk = logs.read_chunk(root, artifact, chunk.next_offset, logs.MAX_LOG_PAGE)

    return StreamingResponse(
        body(),
        media_type="text/plain; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="run-{found_id}.log"'},
    )
