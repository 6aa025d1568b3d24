"""Notification channels, rules and test deliveries, and the retention policy of a project (admin).

A channel's URL and secret are write-only: no response carries them, except a webhook secret the
server generated, shown once in the create response (docs/notifications.md, docs/retention.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field

from ql3.application import auth, notifications, retention, tasks
from ql3.application.notifications import ChannelView, Delivery, RuleView
from ql3.domain import notifications as rules
from ql3.http import logs
from ql3.http.auth import DbDep, PrincipalDep, bearer
from ql3.http.dto import Body, integer_schema
from ql3.ports import channels
from ql3.ports.storage import Database, Transaction

router = APIRouter(prefix="/api/v1/projects/{project}", tags=["notifications"])
ADMIN = "project.admin"


class ChannelCreate(Body):
    name: str = Field(max_length=64)
    kind: Literal["webhook", "apprise"]
    url: str = Field(max_length=2048)
    secret: str | None = Field(default=None, max_length=256)


class ChannelOut(BaseModel):
    id: str
    name: str
    kind: str
    scheme: str
    created_at_ms: int
    secret: str | None = Field(default=None, description="only when the server generated it, once")


class ChannelList(BaseModel):
    items: list[ChannelOut]


class RuleCreate(Body):
    channel: str = Field(max_length=64)
    task: str | None = Field(default=None, max_length=128)
    events: list[str] | None = Field(default=None, max_length=16)


class RuleOut(BaseModel):
    id: str
    channel: str
    task: str | None
    events: list[str]
    created_at_ms: int


class RuleList(BaseModel):
    items: list[RuleOut]


class DeliveryOut(BaseModel):
    id: str
    event: str
    status: str
    attempts: int
    last_error: str | None
    created_at_ms: int
    updated_at_ms: int


class HistoryItem(DeliveryOut):
    channel: str | None = Field(description="the channel's name; null once the channel was removed")


class HistoryPage(BaseModel):
    items: list[HistoryItem]
    next_cursor: str | None = None


class RetentionIn(Body):
    keep_days: Annotated[int, integer_schema(1, retention.MAX_KEEP_DAYS)] | None = None
    runs_per_task: Annotated[int, integer_schema(1, retention.MAX_RUNS_PER_TASK)] | None = None
    log_bytes_per_run: (
        Annotated[int, integer_schema(retention.MIN_LOG_BYTES, retention.MAX_LOG_BYTES)] | None
    ) = None


class RetentionOut(BaseModel):
    keep_days: int | None
    runs_per_task: int | None
    log_bytes_per_run: int | None
    version: int
    updated_at_ms: int | None


def _channel(view: ChannelView, secret: str | None = None) -> ChannelOut:
    return ChannelOut(
        id=view.id,
        name=view.name,
        kind=view.kind,
        scheme=view.scheme,
        created_at_ms=view.created_at_ms,
        secret=secret,
    )


def _rule(view: RuleView) -> RuleOut:
    return RuleOut(
        id=view.id, channel=view.channel, task=view.task, events=view.events, created_at_ms=view.created_at_ms
    )


def _delivery(d: Delivery) -> DeliveryOut:
    return DeliveryOut(
        id=d.id,
        event=d.event,
        status=d.status,
        attempts=d.attempts,
        last_error=d.last_error,
        created_at_ms=d.created_at_ms,
        updated_at_ms=d.updated_at_ms,
    )


@router.post("/notifications/channels", response_model=ChannelOut, status_code=status.HTTP_201_CREATED)
def create_channel(
    project: str, body: ChannelCreate, request: Request, db: DbDep, principal: PrincipalDep
) -> ChannelOut:
    """A webhook (JSON, signed with HMAC-SHA256 of the body under ``secret``) or an apprise URL
    (``tgram://``, ``mailto://``, ``dingtalk://``, ``wecombot://``, ``bark://``...). Without a
    ``secret`` a webhook gets a generated one, returned in this response only. A target the server's
    egress policy refuses (loopback, link-local, private ranges, its own addresses, unless opened by
    ``--notify-allow``) is 422 ``egress_refused``."""
    egress = request.app.state.egress
    generated = notifications.new_webhook_secret() if body.kind == "webhook" and body.secret is None else None

    def unit(tx: Transaction) -> ChannelOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        view = notifications.create_channel(
            tx,
            found,
            name=body.name,
            kind=body.kind,
            url=body.url,
            secret=body.secret or generated,
            egress=egress,
        )
        return _channel(view, generated)

    return db.transaction(unit)


@router.get("/notifications/channels", response_model=ChannelList)
def list_channels(project: str, db: DbDep, principal: PrincipalDep) -> ChannelList:
    def unit(tx: Transaction) -> ChannelList:
        found = auth.authorize(tx, principal, project, ADMIN)
        return ChannelList(items=[_channel(c) for c in notifications.list_channels(tx, found)])

    return db.transaction(unit, write=False)


@router.delete(
    "/notifications/channels/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response
)
def delete_channel(project: str, name: str, db: DbDep, principal: PrincipalDep) -> Response:
    """Remove a channel with its rules and its undelivered messages."""

    def unit(tx: Transaction) -> None:
        found = auth.authorize(tx, principal, project, ADMIN)
        notifications.delete_channel(tx, found, name)

    db.transaction(unit)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/notifications/channels/{name}/test", response_model=DeliveryOut, status_code=status.HTTP_202_ACCEPTED
)
def test_channel(project: str, name: str, db: DbDep, principal: PrincipalDep) -> DeliveryOut:
    """Queue a test message through the outbox; poll the delivery for its result."""

    def unit(tx: Transaction) -> DeliveryOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        return _delivery(notifications.enqueue_test(tx, found, name))

    return db.transaction(unit)


@router.get("/notifications/deliveries", response_model=HistoryPage)
def list_deliveries(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[
        str | None,
        Query(
            max_length=128,
            pattern=r"^[0-9]{1,18}\.[0-9a-f-]{1,64}$",
            description="the next_cursor of the previous page",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=notifications.MAX_HISTORY_PAGE)] = 50,
) -> HistoryPage:
    """The delivery history, newest first (settled messages are kept a week): pass ``next_cursor``
    back as ``cursor`` for the next page."""

    def unit(tx: Transaction) -> HistoryPage:
        found = auth.authorize(tx, principal, project, ADMIN)
        page, next_cursor = notifications.delivery_history(tx, found, cursor=cursor, limit=limit)
        items = [HistoryItem(**_delivery(e.delivery).model_dump(), channel=e.channel_name) for e in page]
        return HistoryPage(items=items, next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.get("/notifications/deliveries/{delivery_id}", response_model=DeliveryOut)
def show_delivery(project: str, delivery_id: str, db: DbDep, principal: PrincipalDep) -> DeliveryOut:
    def unit(tx: Transaction) -> DeliveryOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        return _delivery(notifications.get_delivery(tx, found, delivery_id))

    return db.transaction(unit, write=False)


@router.post("/notifications/rules", response_model=RuleOut, status_code=status.HTTP_201_CREATED)
def create_rule(project: str, body: RuleCreate, db: DbDep, principal: PrincipalDep) -> RuleOut:
    """Send ``events`` (default: failed, timed_out, lost, cancellation_blocked, approval_requested;
    ``succeeded`` on request) of one ``task`` (or of every task) to ``channel``."""

    def unit(tx: Transaction) -> RuleOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        task = tasks.find_task(tx, found.id, body.task) if body.task is not None else None
        return _rule(
            notifications.create_rule(tx, found, channel=body.channel, task=task, events=body.events)
        )

    return db.transaction(unit)


@router.get("/notifications/rules", response_model=RuleList)
def list_rules(project: str, db: DbDep, principal: PrincipalDep) -> RuleList:
    def unit(tx: Transaction) -> RuleList:
        found = auth.authorize(tx, principal, project, ADMIN)
        return RuleList(items=[_rule(r) for r in notifications.list_rules(tx, found)])

    return db.transaction(unit, write=False)


@router.delete(
    "/notifications/rules/{rule_id}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response
)
def delete_rule(project: str, rule_id: str, db: DbDep, principal: PrincipalDep) -> Response:
    def unit(tx: Transaction) -> None:
        found = auth.authorize(tx, principal, project, ADMIN)
        notifications.delete_rule(tx, found, rule_id)

    db.transaction(unit)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/retention", response_model=RetentionOut)
def show_retention(project: str, db: DbDep, principal: PrincipalDep) -> RetentionOut:
    """The project's retention policy (all limits null: everything is kept)."""

    def unit(tx: Transaction) -> RetentionOut:
        found = auth.authorize(tx, principal, project, "task.read")
        policy = retention.get_policy(tx, found)
        if policy is None:
            return RetentionOut(
                keep_days=None, runs_per_task=None, log_bytes_per_run=None, version=0, updated_at_ms=None
            )
        return _retention(policy)

    return db.transaction(unit, write=False)


@router.put("/retention", response_model=RetentionOut)
def set_retention(project: str, body: RetentionIn, db: DbDep, principal: PrincipalDep) -> RetentionOut:
    """Replace the policy: runs older than ``keep_days`` and beyond the newest ``runs_per_task`` of each
    task are pruned (terminal runs only); kept logs are cut to ``log_bytes_per_run``."""

    def unit(tx: Transaction) -> RetentionOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        policy = retention.set_policy(
            tx,
            found,
            keep_days=body.keep_days,
            runs_per_task=body.runs_per_task,
            log_bytes_per_run=body.log_bytes_per_run,
        )
        tx.notify(channels.RETENTION)
        return _retention(policy)

    return db.transaction(unit)


def _retention(policy: retention.RetentionPolicy) -> RetentionOut:
    return RetentionOut(
        keep_days=policy.keep_days,
        runs_per_task=policy.runs_per_task,
        log_bytes_per_run=policy.log_bytes_per_run,
        version=policy.version,
        updated_at_ms=policy.updated_at_ms,
    )


# -- messages from a running task (ql3 notify TITLE BODY, notify.py, sendNotify.js) ------------------

script_router = APIRouter(prefix="/api/v1", tags=["notifications"])


class ScriptMessageIn(Body):
    title: str = Field(min_length=1, max_length=rules.MAX_SCRIPT_TITLE_CHARS)
    body: str = Field(default="", max_length=rules.MAX_SCRIPT_BODY_CHARS)
    log_lines: int = Field(
        default=0,
        ge=0,
        le=rules.MAX_LOG_LINES,
        description="add the run's last lines of output (secrets masked) where this server holds its log",
    )


class ScriptMessageOut(BaseModel):
    run_id: str
    deliveries: int = Field(description="messages queued: one per channel whose rule takes script messages")


@script_router.post("/notify", response_model=ScriptMessageOut, status_code=status.HTTP_202_ACCEPTED)
def notify_from_script(
    body: ScriptMessageIn,
    request: Request,
    db: DbDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ScriptMessageOut:
    """A running task's message to its project's channels (rules with the ``script`` event), sent
    through the outbox. The bearer is the run's notify credential (``$QL3_NOTIFY_TOKEN`` in the
    task's environment), valid only while that attempt runs: 401 ``notify_credential_invalid``
    otherwise, 409 ``attempt_not_running`` in the moment before it runs (retry), 429
    ``notify_limit_reached`` past the per-run limit. 422: a title with a line break or a control
    character, a body with control characters other than newlines and tabs."""
    token = credentials.credentials if credentials else None
    # The console link in the message: the console of the server the task reached.
    console_url = str(request.base_url)
    tail = _log_tail(request, db, token, body.log_lines)

    def unit(tx: Transaction) -> ScriptMessageOut:
        sent = notifications.send_from_script(
            tx, token, body.title, body.body, console_url, tail, request.app.state.secret_box
        )
        return ScriptMessageOut(run_id=sent.run_id, deliveries=sent.deliveries)

    return db.transaction(unit)


def _log_tail(request: Request, db: Database, token: str | None, lines: int) -> notifications.LogTail | None:
    """The end of the run's log file on this server (``ql3 serve``), read before the write unit; a
    server without the file (a remote worker's run) sends the message without an excerpt."""
    root: Path | None = getattr(request.app.state, "logs_root", None)
    if lines <= 0 or root is None:
        return None
    artifact = db.transaction(lambda tx: notifications.attempt_log_artifact(tx, token), write=False)
    if artifact is None:
        return None
    try:
        data, whole = logs.read_tail(root, artifact, rules.LOG_TAIL_BYTES)
    except logs.LogsUnavailable:
        return None
    return notifications.LogTail(data=data, whole=whole, lines=lines)
