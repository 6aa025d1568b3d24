"""Notifications: channels and rules, the transactional outbox, and the bounded delivery loop.

An outcome (a run failing, a cancellation blocking, an approval being requested...) enqueues one outbox
row per matching channel in the transaction that commits the outcome, keyed by a unique outcome key, so
a crash can neither lose it nor enqueue it twice. The delivery loop claims due rows under a lease,
sends outside any transaction, and settles with a fence on (owner, attempt count). See
docs/notifications.md.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final

from ql3.application import auth, log_ranges, variables
from ql3.application.parking import UNEXPECTED, ItemGuard, Parked, is_transient
from ql3.domain import leases as lease_rules
from ql3.domain import notifications as rules
from ql3.domain.egress import EgressPolicy, check_channel_target
from ql3.domain.errors import Conflict, NotFound, Ql3Error, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Project, Run, Task
from ql3.domain.notifications import ChannelTarget, DeliveryFailed, DeliveryStatus, Message
from ql3.domain.tasks import validate_name
from ql3.domain.variables import mask, mask_bytes
from ql3.ports import channels
from ql3.ports.logs import LogFiles
from ql3.ports.notifications import NotificationSender
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Database, Transaction
from ql3.repositories import notifications as repo
from ql3.repositories import runs as run_store
from ql3.repositories import tasks as task_store
from ql3.repositories.notifications import ChannelView as ChannelView
from ql3.repositories.notifications import Delivery as Delivery
from ql3.repositories.notifications import OutboxMessage

log = logging.getLogger("ql3.notifications")
PAGE: Final = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleView:
    id: str
    channel: str
    task: str | None
    events: list[str]
    created_at_ms: int


# -- channels and rules (admin) --------------------------------------------------------------------


def create_channel(
    tx: Transaction,
    project: Project,
    *,
    name: str,
    kind: str,
    url: str,
    secret: str | None,
    egress: EgressPolicy,
) -> ChannelView:
    """Store a channel; its URL and secret are write-only from here on. A target that ``egress``
    refuses without resolving (a literal address, ``localhost``) is ``egress_refused``; names are judged
    again on every delivery, after resolution."""
    validate_name(name, "channel name")
    checked_kind, scheme = rules.validate_channel(kind, url, secret)
    check_channel_target(egress, checked_kind, url)
    if repo.count_channels(tx, project.id) >= rules.MAX_CHANNELS_PER_PROJECT:
        raise ValidationFailed("too many channels in this project", limit=rules.MAX_CHANNELS_PER_PROJECT)
    inserted = repo.insert_channel(
        tx,
        channel_id=new_id(),
        project_id=project.id,
        name=name,
        kind=checked_kind,
        target=url,
        secret=secret,
        scheme=scheme,
        now=tx.now_ms(),
    )
    if not inserted:
        raise Conflict("a channel with that name exists", code_hint="name_taken")
    return get_channel(tx, project, name)


def get_channel(tx: Transaction, project: Project, name: str) -> ChannelView:
    found = repo.get_channel_by_name(tx, project.id, name)
    if found is None:
        raise NotFound("channel not found")
    return found


def list_channels(tx: Transaction, project: Project) -> list[ChannelView]:
    return repo.list_channels(tx, project.id)


def delete_channel(tx: Transaction, project: Project, name: str) -> None:
    """Remove a channel, its rules and its undelivered messages (delivered ones stay as history)."""
    channel = get_channel(tx, project, name)
    repo.delete_channel(tx, project.id, channel.id)


def create_rule(
    tx: Transaction, project: Project, *, channel: str, task: Task | None, events: list[str] | None
) -> RuleView:
    """Route ``events`` of one task (or of every task when ``task`` is None) to ``channel``."""
    found = get_channel(tx, project, channel)
    events_csv = rules.validate_events(events)
    if repo.count_rules(tx, project.id) >= rules.MAX_RULES_PER_PROJECT:
        raise ValidationFailed("too many rules in this project", limit=rules.MAX_RULES_PER_PROJECT)
    rule_id = new_id()
    now = tx.now_ms()
    repo.insert_rule(
        tx,
        rule_id=rule_id,
        project_id=project.id,
        channel_id=found.id,
        task_id=task.id if task else "",
        events=events_csv,
        now=now,
    )
    return RuleView(
        id=rule_id,
        channel=found.name,
        task=task.name if task else None,
        events=events_csv.split(","),
        created_at_ms=now,
    )


def list_rules(tx: Transaction, project: Project) -> list[RuleView]:
    names = {c.id: c.name for c in list_channels(tx, project)}
    out: list[RuleView] = []
    for rule in repo.list_rules(tx, project.id):
        out.append(
            RuleView(
                id=rule.id,
                channel=names.get(rule.channel_id, ""),
                task=repo.get_task_name(tx, rule.task_id) if rule.task_id else None,
                events=rule.events.split(","),
                created_at_ms=rule.created_at_ms,
            )
        )
    return out


def delete_rule(tx: Transaction, project: Project, rule_id: str) -> None:
    if not isinstance(rule_id, str) or len(rule_id) > 64 or not repo.delete_rule(tx, project.id, rule_id):
        raise NotFound("rule not found")


# -- the outbox: enqueued in the outcome's own transaction -------------------------------------------


def _enqueue(
    tx: Transaction,
    *,
    project_id: str,
    task_id: str | None,
    event: str,
    outcome_key: str,
    facts: dict[str, Any],
    only_channel: str | None = None,
) -> list[str]:
    """Insert one pending row per matching channel; returns the ids of rows inserted now."""
    if only_channel is not None:
        channel_ids = [only_channel]
    else:
        matched = [
            rule.channel_id
            for rule in repo.list_rules(tx, project_id)
            if rules.rule_matches(rule.events, rule.task_id, event, task_id)
        ]
        channel_ids = sorted(set(matched))
    if not channel_ids:
        return []
    project = auth.resolve_project(tx, project_id).name
    task = repo.get_task_name(tx, task_id) if task_id else None
    body = {"event": event, "project": project, "task": task, **facts}
    inserted: list[str] = []
    now = tx.now_ms()
    for channel_id in channel_ids:
        row_id = new_id()
        payload = {**body, "delivery_id": row_id, "at_ms": now}
        if repo.insert_outbox(
            tx,
            delivery_id=row_id,
            project_id=project_id,
            channel_id=channel_id,
            outcome_key=outcome_key,
            event=event,
            payload_json=json.dumps(payload, separators=(",", ":"), sort_keys=True),
            now=now,
        ):
            inserted.append(row_id)
    if inserted:
        tx.notify(channels.NOTIFICATIONS)
    return inserted


def on_run_status(tx: Transaction, run: Run) -> None:
    """Called by the one Run write path whenever a Run's status changes (``written`` is the new row)."""
    if run.status not in rules.RUN_STATUS_EVENTS:
        return
    attempt = run_store.latest_attempt(tx, run.id)
    _enqueue(
        tx,
        project_id=run.project_id,
        task_id=run.task_id,
        event=run.status,
        # The version makes each loss of a run its own outcome; a terminal status happens once anyway.
        outcome_key=f"run:{run.id}:{run.status}:{run.version}",
        facts={
            "run_id": run.id,
            "status": run.status,
            "exit_code": run.exit_code,
            "error_code": run.error_code,
            "trigger": run.trigger_type,
            # The attempt the outcome is about: its log is the excerpt's, even once a retry starts.
            "attempt": None if attempt is None else attempt.attempt,
        },
    )


def on_cancellation_blocked(tx: Transaction, run: Run, dispatch_version: int) -> None:
    """A cancellation could not prove the process's identity: someone has to look."""
    _enqueue(
        tx,
        project_id=run.project_id,
        task_id=run.task_id,
        event="cancellation_blocked",
        outcome_key=f"cancel:{run.id}:{dispatch_version}",
        facts={"run_id": run.id, "status": run.status},
    )


def on_cron_late(tx: Transaction, run_id: str, project_id: str, task_id: str, waited_ms: int) -> None:
    """A cron run still queued (waiting for a slot) past the lateness bound (docs/cron.md)."""
    _enqueue(
        tx,
        project_id=project_id,
        task_id=task_id,
        event="cron_late",
        outcome_key=f"cron_late:{run_id}",
        facts={"run_id": run_id, "status": "queued", "trigger": "cron", "waited_ms": waited_ms},
    )


def on_approval_requested(tx: Transaction, project_id: str, task_id: str, approval_id: str) -> None:
    _enqueue(
        tx,
        project_id=project_id,
        task_id=task_id,
        event="approval_requested",
        outcome_key=f"approval:{approval_id}",
        facts={"approval_id": approval_id},
    )


def enqueue_test(tx: Transaction, project: Project, channel: str) -> Delivery:
    """A test message to one channel, through the same outbox and loop as real outcomes."""
    found = get_channel(tx, project, channel)
    ids = _enqueue(
        tx,
        project_id=project.id,
        task_id=None,
        event="test",
        outcome_key=f"test:{new_id()}",
        facts={},
        only_channel=found.id,
    )
    return get_delivery(tx, project, ids[0])


class NotifyCredentialInvalid(Ql3Error):
    """The notify credential is not valid, or its run has ended."""

    code = "notify_credential_invalid"
    http_status = 401


class AttemptNotRunning(Ql3Error):
    """The run is starting: its notify credential is valid once it runs (retry in a moment)."""

    code = "attempt_not_running"
    http_status = 409
    retryable = True


class NotifyLimitReached(Ql3Error):
    """This run has sent as many messages as a run may."""

    code = "notify_limit_reached"
    http_status = 429


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptSent:
    run_id: str
    deliveries: int  # rows enqueued: one per channel whose rule takes ``script`` messages


@dataclass(frozen=True, slots=True, kw_only=True)
class LogTail:
    """The end of the attempt's log as the server holds it, for the message's excerpt."""

    data: bytes
    whole: bool  # the log's first byte is in ``data``
    lines: int


def attempt_log_artifact(tx: Transaction, credential: str | None) -> str | None:
    """The log artifact of the attempt a well-formed credential names (None: no such attempt). Only
    for reading its tail before ``send_from_script``, which checks the credential itself."""
    parsed = rules.parse_notify_token(credential)
    attempt = None if parsed is None else run_store.get_attempt(tx, parsed[0])
    return None if attempt is None else attempt.log_artifact_id or attempt.id


def running_attempt(tx: Transaction, credential: str | None) -> tuple[str, str, Run]:
    """The attempt id, the secret and the run of a run's own credential (``$QL3_NOTIFY_TOKEN``),
    valid only while that attempt runs: 401 ``notify_credential_invalid`` otherwise, 409
    ``attempt_not_running`` before it runs."""
    parsed = rules.parse_notify_token(credential)
    if parsed is None:
        raise NotifyCredentialInvalid()
    attempt_id, token = parsed
    attempt = run_store.get_attempt(tx, attempt_id)
    if attempt is None:
        raise NotifyCredentialInvalid()
    if attempt.status in ("claimed", "starting"):
        raise AttemptNotRunning()
    if (
        attempt.status != "running"
        or attempt.callback_token_hash is None
        or not hmac.compare_digest(rules.notify_secret(attempt.callback_token_hash), token)
    ):
        raise NotifyCredentialInvalid()
    run = run_store.get_run(tx, attempt.run_id)
    if run is None:
        raise NotifyCredentialInvalid()
    return attempt.id, token, run


def send_from_script(
    tx: Transaction,
    credential: str | None,
    title: object,
    body: object,
    console_url: str | None,
    log: LogTail | None = None,
    box: SecretBox | None = None,
) -> ScriptSent:
    """A message from a running task (``ql3 notify``, notify.py, sendNotify.js) to its project's channels.

    The credential is the attempt's id and a secret derived from its callback token
    (``rules.notify_token``): valid only while that attempt runs, checked against the callback token's
    digest stored at the running ACK, so it ends with the attempt; neither the callback token nor any
    other credential reaches the task (docs/notifications.md "From a script").

    The project's secret values (opened with ``box``) are masked in the title, the body and the log
    excerpt, the task's own env values in the excerpt too: a message is a way out of the server like
    any other (docs/variables.md "Secrets").
    """
    attempt_id, token, run = running_attempt(tx, credential)
    title_text, body_text = rules.script_text(title, body)
    tokens = [token, f"{rules.NOTIFY_TOKEN_PREFIX}{attempt_id}.{token}"]
    hidden = variables.secret_values(tx, run.project_id, box) + tokens
    title_text, body_text = mask(title_text, hidden), mask(body_text, hidden)
    prefix = f"script:{attempt_id}:"
    if repo.count_outcomes(tx, run.project_id, prefix) >= rules.MAX_SCRIPT_MESSAGES_PER_ATTEMPT:
        raise NotifyLimitReached(limit=rules.MAX_SCRIPT_MESSAGES_PER_ATTEMPT)
    link = None if console_url is None else rules.run_link(console_url, run.id)
    facts: dict[str, Any] = {"run_id": run.id, "title": title_text, "message": body_text, "link": link}
    if log is not None and log.lines > 0:
        # The project's secrets, the task's env values and the run's own tokens never leave in an
        # excerpt (the secrets first: they are masked from 3 characters, env values from 4).
        revision = task_store.get_revision(tx, run.task_id, run.task_revision)
        env = (revision.spec.get("env") if revision is not None else None) or {}
        data = mask_bytes(log.data, hidden)
        facts["log"] = rules.log_excerpt(data, log.lines, [str(v) for v in env.values()], whole=log.whole)
        facts = rules.fit_payload(facts, "log", keep_end=True)
    facts = rules.fit_payload(facts, "message")
    ids = _enqueue(
        tx,
        project_id=run.project_id,
        task_id=run.task_id,
        event="script",
        outcome_key=prefix + new_id(),
        facts=facts,
    )
    return ScriptSent(run_id=run.id, deliveries=len(ids))


def get_delivery(tx: Transaction, project: Project, delivery_id: str) -> Delivery:
    found = (
        repo.get_delivery(tx, project.id, delivery_id)
        if isinstance(delivery_id, str) and len(delivery_id) <= 64
        else None
    )
    if found is None:
        raise NotFound("delivery not found")
    return found


MAX_HISTORY_PAGE: Final = 200


def delivery_history(
    tx: Transaction, project: Project, *, cursor: str | None, limit: int
) -> tuple[list[repo.HistoryEntry], str | None]:
    """A page of the project's deliveries, newest first, and the cursor of the next page (None at the
    end). The cursor is ``<created_at_ms>.<id>`` of the page's last entry; any other text is 422."""
    if not 1 <= limit <= MAX_HISTORY_PAGE:
        raise ValidationFailed("limit must be between 1 and 200", limit=MAX_HISTORY_PAGE)
    before_ms, before_id = repo.FIRST_PAGE_MS, ""
    if cursor:
        ms_text, _, before_id = cursor.partition(".")
        if not ms_text.isdigit() or not before_id or len(cursor) > 128 or int(ms_text) >= repo.FIRST_PAGE_MS:
            raise ValidationFailed("invalid cursor: pass back the next_cursor of the previous page")
        before_ms = int(ms_text)
    page = repo.list_history(tx, project.id, before_ms=before_ms, before_id=before_id, limit=limit)
    last = page[-1].delivery if len(page) == limit else None
    return page, (f"{last.created_at_ms}.{last.id}" if last is not None else None)


# -- delivery -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryBudget:
    lease_ms: int = 60_000
    max_attempts: int = 8
    backoff_base_ms: int = 5_000
    backoff_max_ms: int = 3_600_000
    page: int = PAGE

    def __post_init__(self) -> None:
        if not (
            lease_rules.NOTIFICATION.contains(self.lease_ms)
            and 1 <= self.max_attempts <= 64
            and 1 <= self.backoff_base_ms <= self.backoff_max_ms <= 86_400_000
            and 1 <= self.page <= 64
        ):
            raise ValidationFailed("invalid notification delivery budget")


@dataclass(frozen=True, slots=True, kw_only=True)
class Claimed:
    id: str
    attempts: int
    target: ChannelTarget | None
    message: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchReport:
    claimed: int
    delivered: int
    retried: int
    dead: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunExcerpts:
    """What the deliverer adds to a run's outcome as it sends it (docs/notifications.md "Log excerpt
    and link"): ``console_url`` (None: no link), the local log files (None: shipped logs only) and
    the box that opens the project's secrets, which are masked in the excerpt."""

    console_url: str | None = None
    logs: LogFiles | None = None
    box: SecretBox | None = None
    lines: int = rules.OUTCOME_LOG_LINES


def run_log_excerpt(
    tx: Transaction, run_id: str, excerpts: RunExcerpts, attempt_number: int | None = None
) -> str | None:
    """The last lines of the log of the run's attempt ``attempt_number`` (None: its latest attempt),
    read from its end (at most ``rules.LOG_TAIL_BYTES``): the shipped log in the database when there
    is one, else the local log file. The project's secret values and the task's env values are masked
    as in a script's message. None when there is no such attempt or this server holds no log of it."""
    # Imported here: attempt_logs -> workers -> tasks -> runs imports this module.
    from ql3.application import attempt_logs

    run = run_store.get_run(tx, run_id)
    attempt = None
    if run is not None and attempt_number is None:
        attempt = run_store.latest_attempt(tx, run_id)
    elif run is not None:
        attempt = next((a for a in run_store.list_attempts(tx, run_id) if a.attempt == attempt_number), None)
    if run is None or attempt is None:
        return None
    head = attempt_logs.head(tx, attempt.id)
    if head is not None:
        span = log_ranges.tail_span(head.length, rules.LOG_TAIL_BYTES)
        data = b""
        if span.end > span.start:
            data = attempt_logs.read(tx, head, span.start, span.end - span.start).data
        whole = span.start == 0
    elif excerpts.logs is not None:
        data, whole = excerpts.logs.tail(attempt.log_artifact_id or attempt.id, rules.LOG_TAIL_BYTES)
    else:
        return None
    hidden = variables.secret_values(tx, run.project_id, excerpts.box)
    revision = task_store.get_revision(tx, run.task_id, run.task_revision)
    env = (revision.spec.get("env") if revision is not None else None) or {}
    return rules.log_excerpt(
        mask_bytes(data, hidden), excerpts.lines, [str(v) for v in env.values()], whole=whole
    )


def _message(stored: OutboxMessage) -> Message:
    body = stored.payload
    return Message(
        delivery_id=stored.id,
        event=stored.event,
        title=rules.title_for(stored.event, str(body.get("project")), body.get("task"), body.get("title")),
        body=body,
    )


class NotificationDeliverer:
    """Claims due outbox rows under a lease, sends each outside any transaction, settles with a fence.

    A row whose lease expired (its deliverer crashed) is due again; the attempt count is the fence, so a
    late settle of an old claim changes nothing. Rows that fail ``max_attempts`` times become ``dead``.
    """

    def __init__(
        self,
        db: Database,
        sender: NotificationSender,
        owner: str,
        *,
        budget: DeliveryBudget | None = None,
        fault: Callable[[str], None] = lambda point: None,
        guard: ItemGuard | None = None,
        excerpts: RunExcerpts | None = None,
    ) -> None:
        if not owner or len(owner) > 128:
            raise ValidationFailed("invalid lease owner")
        self._db = db
        self._sender = sender
        self._owner = owner
        self._budget = budget or DeliveryBudget()
        self._fault = fault
        self._guard = guard
        self._excerpts = excerpts

    def claim(self, tx: Transaction) -> list[Claimed]:
        """Lease up to one page of due rows (pending, or leased with an expired lease)."""
        now = tx.now_ms()
        out: list[Claimed] = []
        for due in repo.list_due(tx, now=now, limit=self._budget.page):
            claimed = repo.claim_outbox(
                tx,
                delivery_id=due.id,
                expected_attempts=due.attempts,
                owner=self._owner,
                lease_expires_at_ms=now + self._budget.lease_ms,
                now=now,
            )
            if not claimed:
                continue
            stored = repo.get_outbox_message(tx, due.id)
            assert stored is not None  # claimed just now, in this transaction
            target = repo.get_channel_target(tx, stored.channel_id)
            out.append(
                Claimed(id=stored.id, attempts=due.attempts + 1, target=target, message=_message(stored))
            )
        return out

    def settle(self, tx: Transaction, claimed: Claimed, error: str | None) -> str:
        """Record one delivery result; returns the new status (or ``stale`` when the claim was lost)."""
        now = tx.now_ms()
        status: DeliveryStatus
        if error is None:
            status, due = "delivered", None
        elif claimed.attempts >= self._budget.max_attempts or claimed.target is None:
            status, due = "dead", None
        else:
            status = "pending"
            due = now + rules.backoff_ms(
                claimed.attempts, self._budget.backoff_base_ms, self._budget.backoff_max_ms
            )
        settled = repo.settle_outbox(
            tx,
            delivery_id=claimed.id,
            status=status,
            due_at_ms=due,
            last_error=error,
            owner=self._owner,
            expected_attempts=claimed.attempts,
            now=now,
        )
        return status if settled else "stale"

    def deliver_batch(self) -> BatchReport:
        """One cycle: claim a page, send each message, settle each. Bounded by the page size."""
        claimed = self._db.transaction(self.claim)
        delivered = retried = dead = 0
        for item in claimed:
            # The outbox's own backoff decides when a delivery is due again, so a parked one is never
            # skipped here: its row records the failure, and the settle below backs the row off.
            handled = (
                self._deliver_one(item)
                if self._guard is None
                else self._guard.run("delivery", item.id, partial(self._deliver_one, item), skip_parked=False)
            )
            status, error = (
                (self._settle_parked(item), UNEXPECTED) if isinstance(handled, Parked) else handled
            )
            if status == "delivered":
                delivered += 1
            elif status == "dead":
                dead += 1
                log.warning(
                    "notification dead after its last attempt",
                    extra={"action": "notify.dead", "delivery_id": item.id, "error": error},
                )
            elif status == "pending":
                retried += 1
        return BatchReport(claimed=len(claimed), delivered=delivered, retried=retried, dead=dead)

    def _deliver_one(self, item: Claimed) -> tuple[str, str | None]:
        self._fault("notify_before_send")
        error: str | None = None
        if item.target is None:
            error = "channel_missing"
        else:
            try:
                self._sender.send(item.target, self._with_run_context(item))
            except DeliveryFailed as exc:
                error = exc.reason
        self._fault("notify_after_send")
        status: str = self._db.transaction(partial(self.settle, claimed=item, error=error))
        return status, error

    def _with_run_context(self, item: Claimed) -> Message:
        """A run's outcome with its console link and, for a failure, its last log lines, read as it
        is sent (a finished run's log is whole by then). A log that cannot be read never holds the
        message back: it goes without the excerpt."""
        message, excerpts = item.message, self._excerpts
        run_id = message.body.get("run_id")
        if excerpts is None or message.event not in rules.RUN_EVENTS or not isinstance(run_id, str):
            return message
        body = dict(message.body)
        if excerpts.console_url and not body.get("link"):
            body["link"] = rules.run_link(excerpts.console_url, run_id)
        if message.event in rules.EXCERPT_EVENTS and excerpts.lines > 0:
            number = body.get("attempt") if type(body.get("attempt")) is int else None
            try:
                excerpt = self._db.transaction(
                    partial(run_log_excerpt, run_id=run_id, excerpts=excerpts, attempt_number=number),
                    write=False,
                )
            except Exception as exc:
                log.warning(
                    "the run's log excerpt could not be read; sending without it",
                    extra={
                        "action": "notify.excerpt_unavailable",
                        "delivery_id": item.id,
                        "error": type(exc).__name__,
                    },
                )
                excerpt = None
            if excerpt:
                body = rules.fit_payload({**body, "log": excerpt}, "log", keep_end=True)
        return replace(message, body=body)

    def _settle_parked(self, item: Claimed) -> str:
        """A delivery that failed unexpectedly counts as a failed attempt (backoff, then dead)."""
        try:
            status: str = self._db.transaction(partial(self.settle, claimed=item, error=UNEXPECTED))
        except Exception as exc:
            if is_transient(exc):
                raise
            log.warning(
                "settling a parked delivery failed",
                extra={"action": "notify.settle_failed", "delivery_id": item.id, "error": type(exc).__name__},
            )
            return "stale"  # its lease expires and it is claimed again
        return status

    def next_due_ms(self) -> int | None:
        return self._db.transaction(repo.next_due_ms, write=False)


def new_webhook_secret() -> str:
    """A fresh secret for a webhook channel when the caller does not bring one."""
    return secrets.token_urlsafe(32)
