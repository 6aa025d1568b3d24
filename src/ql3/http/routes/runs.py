"""Runs: keyset-paginated list, show, the event log and the attempt's log."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ql3.application import (
    attempt_logs,
    auth,
    log_ranges,
    lookup,
    run_queries,
    runs,
    tasks,
    variables,
    workers,
)
from ql3.application.dispatch_reasons import DispatchReasons
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.ids import is_id
from ql3.domain.model import Attempt, Run
from ql3.domain.states import is_run_terminal
from ql3.domain.variables import mask, mask_bytes
from ql3.http import logs
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import (
    DispatchReasonOut,
    EventPage,
    LogMatch,
    LogPage,
    LogSearchPage,
    RunOut,
    RunPage,
    event_out,
    run_row_out,
)
from ql3.http.routes.variables import BoxDep
from ql3.ports.storage import Database, Transaction

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


def get_dispatch_reasons(request: Request) -> DispatchReasons | None:
    board: DispatchReasons | None = getattr(request.app.state, "dispatch_reasons", None)
    return board


ReasonsDep = Annotated[DispatchReasons | None, Depends(get_dispatch_reasons)]


def dispatch_reasons_of(board: DispatchReasons | None, run: Run) -> list[DispatchReasonOut] | None:
    """What this server's dispatcher said about ``run`` (None: this server runs no dispatcher); the
    reasons that stopped whole cycles count only while the run waits (queued or dispatching), and only
    those seen since it was queued."""
    if board is None:
        return None
    waiting = run.status in ("queued", "dispatching")
    since = (run.queued_at_ms or run.created_at_ms) if waiting else None
    return [
        DispatchReasonOut(
            reason=seen.reason,
            scope=seen.scope,
            first_seen_at_ms=seen.first_seen_ms,
            last_seen_at_ms=seen.last_seen_ms,
            count=seen.count,
        )
        for seen in board.for_run(run.id, cycle_since_ms=since)
    ]


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
async def show_run(
    project: str, run_id: str, db: DbDep, principal: PrincipalDep, board: ReasonsDep
) -> RunOut:
    """Async, with the unit alone in the thread pool (polled by ``ql3 run start --wait``): a plain
    ``def`` route's response would be validated in the thread pool too, one more hand-off.
    ``dispatch_reasons``: what this server's dispatcher said about the run (docs/dispatch.md)."""

    def unit(tx: Transaction) -> RunOut:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        out = run_row_out(run_queries.describe(tx, run), workers.WaitingReasons(tx).reason(run))
        out.dispatch_reasons = dispatch_reasons_of(board, run)
        return out

    out: RunOut = await run_in_threadpool(db.transaction, unit, write=False)
    return out


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Want:
    """Which bytes a log read asks for: forwards from ``offset``, or the ``max_bytes`` before
    ``before``, or the last ``from_end`` bytes (exactly one is set)."""

    offset: int | None
    before: int | None
    from_end: int | None

    def span(self, size: int, max_bytes: int) -> log_ranges.Span:
        if self.from_end is not None:
            return log_ranges.tail_span(size, self.from_end)
        if self.before is not None:
            return log_ranges.before_span(size, self.before, max_bytes)
        raise AssertionError("a forward read has no span")


def _want(offset: int | None, before: int | None, from_end: int | None) -> _Want:
    given = [
        name
        for name, value in (("offset", offset), ("before", before), ("from_end", from_end))
        if value is not None
    ]
    if len(given) > 1:
        raise ValidationFailed("give one of offset, before and from_end", field=given[1])
    forward = (offset or 0) if given in ([], ["offset"]) else None
    return _Want(offset=forward, before=before, from_end=from_end)


def _aligned(start: int, data: bytes, size: int) -> tuple[int, logs.LogChunk]:
    """A ranged read's bytes from where a line (or a character) starts, as a chunk."""
    skip = log_ranges.align_start(data, start)
    start, data = start + skip, data[skip:]
    end = start + len(data)
    return start, logs.LogChunk(data=data, next_offset=end, eof=end >= size, size=size)


@router.get("/{run_id}/logs", response_model=LogPage)
def read_logs(
    project: str,
    run_id: str,
    db: DbDep,
    principal: PrincipalDep,
    logs_root: LogsRootDep,
    box: BoxDep,
    offset: Annotated[
        int | None, Query(ge=0, le=2**62, description="the next_offset of the previous page (default 0)")
    ] = None,
    before: Annotated[
        int | None,
        Query(ge=0, le=2**62, description="read the max_bytes that end here (the offset of a later page)"),
    ] = None,
    from_end: Annotated[
        int | None, Query(ge=1, le=logs.MAX_LOG_PAGE, description="read the last bytes of the log")
    ] = None,
    max_bytes: Annotated[int, Query(ge=1, le=logs.MAX_LOG_PAGE)] = logs.DEFAULT_LOG_PAGE,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPTS_LISTED, description="default: the latest attempt")
    ] = None,
) -> LogPage:
    """A page of the attempt's output (UTF-8, invalid bytes replaced; the project's secret values
    masked as ``***`` within a page, docs/variables.md). Poll with ``offset=next_offset``;
    ``complete`` means the run is terminal and no more bytes follow. ``from_end`` reads the end of
    the log and ``before`` pages backwards; both start the page where a line starts."""
    want = _want(offset, before, from_end)

    def unit(tx: Transaction) -> tuple[bool, Attempt | None, LogPage | None, list[str]]:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        terminal = is_run_terminal(run.status)
        chosen = lookup.attempt_of(tx, run.id, attempt)
        page = None
        if chosen is not None:
            page = _stored_page(tx, chosen, terminal, want, max_bytes, local=logs_root is not None)
        return terminal, chosen, page, variables.secret_values(tx, found.id, box)

    # The status is read before the log: when the run was terminal then, the log was already whole.
    terminal, chosen, stored, secrets = db.transaction(unit, write=False)
    if stored is not None:
        return stored.model_copy(update={"data": mask(stored.data, secrets)}) if secrets else stored
    if chosen is None:  # no attempt yet (queued, or cancelled before one): an empty log
        at = want.offset or 0
        return LogPage(attempt=None, offset=at, next_offset=at, data="", eof=True, complete=terminal, size=0)
    if logs_root is None:  # not reached: without log files every attempt's log is the stored one
        raise logs.LogsUnavailable()
    artifact = chosen.log_artifact_id or chosen.id
    if want.offset is not None:
        start = want.offset
        chunk = logs.read_chunk(logs_root, artifact, start, max_bytes)
    else:
        _, size = logs.read_span(logs_root, artifact, 0, 0)
        span = want.span(size, max_bytes)
        data, size = logs.read_span(logs_root, artifact, span.start, span.end - span.start)
        start, chunk = _aligned(span.start, data, size)
    text, next_offset = logs.split_text(chunk, final=terminal and chunk.eof)
    return LogPage(
        attempt=chosen.attempt,
        offset=start,
        next_offset=next_offset,
        data=mask(text, secrets),
        eof=chunk.eof,  # a character still being written is held back, but nothing else follows yet
        complete=terminal and chunk.eof,  # a terminal run's last page is never held back
        size=chunk.size,
    )


def _stored_page(
    tx: Transaction, chosen: Attempt, terminal: bool, want: _Want, max_bytes: int, *, local: bool
) -> LogPage | None:
    """The page of a log a remote worker shipped to the database (docs/cluster.md "Log shipping"),
    or None when the log is a local file (a server with an embedded worker and nothing shipped).
    A terminal run's log is complete once the worker closed it after the attempt settled, or once
    the quota ended it, or (a worker that died before closing it) a while after the attempt ended."""
    head = attempt_logs.head(tx, chosen.id)
    if head is None and local:
        return None
    size = 0 if head is None else head.length
    if want.offset is not None:
        start = want.offset
        if head is None:
            stored = attempt_logs.StoredPage(data=b"", next_offset=start, eof=True, closed=False)
        else:
            stored = attempt_logs.read(tx, head, start, max_bytes)
        chunk = logs.LogChunk(data=stored.data, next_offset=stored.next_offset, eof=stored.eof, size=size)
        closed = stored.closed
    else:
        span = want.span(size, max_bytes)
        data = b""
        if head is not None and span.end > span.start:
            data = attempt_logs.read(tx, head, span.start, span.end - span.start).data
        start, chunk = _aligned(span.start, data, size)
        closed = head is not None and (head.closed or head.truncated)
    ended_at = chosen.finished_at_ms or chosen.created_at_ms
    closed = closed or tx.now_ms() - ended_at >= attempt_logs.UNCLOSED_COMPLETE_AFTER_MS
    whole = terminal and chunk.eof and closed
    text, next_offset = logs.split_text(chunk, final=whole)
    return LogPage(
        attempt=chosen.attempt,
        offset=start,
        next_offset=next_offset,
        data=text,
        eof=chunk.eof,
        complete=whole,
        size=size,
    )


@router.get("/{run_id}/logs/search", response_model=LogSearchPage)
def search_logs(
    project: str,
    run_id: str,
    db: DbDep,
    principal: PrincipalDep,
    logs_root: LogsRootDep,
    box: BoxDep,
    q: Annotated[
        str, Query(min_length=1, max_length=log_ranges.MAX_QUERY_CHARS, description="the text to find")
    ],
    after: Annotated[
        int | None, Query(ge=0, le=2**62, description="find matches starting here or later")
    ] = None,
    before: Annotated[
        int | None, Query(ge=0, le=2**62, description="find matches starting before this")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=log_ranges.MAX_SEARCH_MATCHES)] = 20,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPTS_LISTED, description="default: the latest attempt")
    ] = None,
) -> LogSearchPage:
    """Byte offsets of the matches of ``q`` in the attempt's whole log (a substring, ASCII letters in
    any case): forwards from ``after`` or backwards from ``before``, at most ``limit``. One request
    scans at most 8 MiB; ``next_cursor`` says where to go on from (null: the scan reached the end)."""
    log_ranges.needle_of(q)  # refused before anything is read
    if after is not None and before is not None:
        raise ValidationFailed("give after or before, not both", field="before")

    def unit(tx: Transaction) -> tuple[Attempt | None, attempt_logs.LogHead | None, list[str]]:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        chosen = lookup.attempt_of(tx, run.id, attempt)
        head = attempt_logs.head(tx, chosen.id) if chosen is not None else None
        return chosen, head, variables.secret_values(tx, found.id, box)

    chosen, head, secrets = db.transaction(unit, write=False)
    if chosen is None:
        return LogSearchPage(attempt=None, matches=[], next_cursor=None, scanned_bytes=0, size=0)
    read: log_ranges.Reader
    if head is not None or logs_root is None:
        size = 0 if head is None else head.length
        read = partial(_read_stored, db, head)
    else:
        root, artifact = logs_root, chosen.log_artifact_id or chosen.id
        _, size = logs.read_span(root, artifact, 0, 0)

        def read(start: int, count: int) -> bytes:
            return logs.read_span(root, artifact, start, count)[0]

    result = log_ranges.search(read, size, q, after=after, before=before, limit=limit, secrets=secrets)
    return LogSearchPage(
        attempt=chosen.attempt,
        matches=[LogMatch(offset=at, length=result.length) for at in result.matches],
        next_cursor=result.next_cursor,
        scanned_bytes=result.scanned_bytes,
        size=size,
    )


def _read_stored(db: Database, head: attempt_logs.LogHead | None, start: int, count: int) -> bytes:
    """Up to ``count`` bytes of a shipped log from ``start``, one bounded read transaction a page."""
    out = bytearray()
    for _ in range(count // attempt_logs.MAX_READ_BYTES + 2):
        if head is None or len(out) >= count:
            break
        page = db.transaction(
            partial(
                attempt_logs.read,
                log=head,
                offset=start + len(out),
                max_bytes=min(attempt_logs.MAX_READ_BYTES, count - len(out)),
            ),
            write=False,
        )
        if not page.data:
            break
        out += page.data
    return bytes(out)


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
    box: BoxDep,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPTS_LISTED, description="default: the latest attempt")
    ] = None,
) -> StreamingResponse:
    """The attempt's whole log as written so far, as a ``text/plain`` download (bytes as written, the
    project's secret values masked as ``***`` within each 256 KiB page)."""

    def unit(tx: Transaction) -> tuple[str, Attempt | None, list[str]]:
        found = auth.authorize(tx, principal, project, "run.read")
        run = runs.get_run(tx, found.id, _run_id(run_id))
        return run.id, lookup.attempt_of(tx, run.id, attempt), variables.secret_values(tx, found.id, box)

    found_id, chosen, secrets = db.transaction(unit, write=False)
    shipped = None
    if chosen is not None:
        attempt_id = chosen.id
        shipped = db.transaction(lambda tx: attempt_logs.head(tx, attempt_id), write=False)
    if shipped is not None or logs_root is None:
        body: Iterator[bytes] = _stored_body(db, shipped)  # None (nothing shipped yet): empty
    else:
        body = _file_body(logs_root, chosen)
    if secrets:
        body = (mask_bytes(page, secrets) for page in body)
    return StreamingResponse(
        body,
        media_type="text/plain; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="run-{found_id}.log"'},
    )


def _file_body(root: Path, chosen: Attempt | None) -> Iterator[bytes]:
    """A local log file; its first page is read before the response starts (a failure is a 404)."""
    artifact = chosen.log_artifact_id or chosen.id if chosen is not None else None
    first = logs.read_chunk(root, artifact, 0, logs.MAX_LOG_PAGE) if artifact else None
    return _file_pages(root, artifact, first)


def _file_pages(root: Path, artifact: str | None, chunk: logs.LogChunk | None) -> Iterator[bytes]:
    for _ in range(MAX_RAW_LOG_PAGES):
        if chunk is None or not chunk.data:
            return
        yield chunk.data
        if chunk.eof or artifact is None:
            return
        chunk = logs.read_chunk(root, artifact, chunk.next_offset, logs.MAX_LOG_PAGE)


def _stored_body(db: Database, head: attempt_logs.LogHead | None) -> Iterator[bytes]:
    """A shipped log, one bounded read transaction per page."""
    if head is None:
        return
    offset = 0
    for _ in range(MAX_RAW_LOG_PAGES):
        page = db.transaction(
            partial(attempt_logs.read, log=head, offset=offset, max_bytes=logs.MAX_LOG_PAGE), write=False
        )
        if not page.data:
            return
        yield page.data
        offset = page.next_offset
        if page.eof:
            return
