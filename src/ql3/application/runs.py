"""Run lifecycle: creation with idempotency, fenced transitions, and the event log."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, replace
from typing import Any, Final

from ql3.application import notifications
from ql3.domain.digests import canonical_json, digest_equals, domain_digest
from ql3.domain.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidRunTransition,
    NotFound,
    ReservedIdempotencyKey,
    RunVersionConflict,
    TaskDisabled,
    ValidationFailed,
)
from ql3.domain.ids import new_id
from ql3.domain.model import Attempt, Run, RunEvent, Task
from ql3.domain.states import (
    attempt_transition_allowed,
    is_run_terminal,
    late_fact_correction_allowed,
    run_transition_allowed,
)
from ql3.domain.tasks import TaskSpec, build_spec
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import runs as repo
from ql3.repositories import tasks as task_repo

MAX_EVENT_PAYLOAD_BYTES: Final = 2048
MAX_PAGE: Final = 100
DEFAULT_PAGE: Final = 50
# Payload keys that may ever appear in an event: low-sensitivity facts only (no command, env, pid...).
EVENT_PAYLOAD_KEYS: Final = frozenset(
    {
        "trigger_type",
        "task_revision",
        "attempt",
        "attempt_id",
        "from",
        "to",
        "exit_code",
        "error_code",
        "reason",
        "worker_id",
        "dispatch_count",
        "result",
        "outcome",
        "lease_generation",
        "mutation_id",
        "previous_dispatch_version",
        "dispatch_version",
        "retry_delay_ms",
        "next_attempt_at_ms",
        "run_version",
        "approval_request_id",
        "dispatch_id",
        "scheduled_for_ms",
        "delay_ms",
        "previous_result",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventSpec:
    type: str
    actor_type: str
    actor_id: str | None = None
    attempt_id: str | None = None
    payload: dict[str, Any] | None = None
    dedupe_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptChange:
    """An Attempt CAS riding along a Run transition: expected status and callback sequence."""

    attempt: Attempt
    new: Attempt


def event_payload_json(payload: dict[str, Any] | None) -> str:
    """An event's payload as stored: allowlisted keys only, bounded, canonical JSON."""
    body = payload or {}
    unknown = set(body) - EVENT_PAYLOAD_KEYS
    if unknown:
        raise ValidationFailed("event payload has keys outside the allowlist", keys=sorted(unknown))
    text = json.dumps(body, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_EVENT_PAYLOAD_BYTES:
        raise ValidationFailed("event payload is too large")
    return text


def append_events(tx: Transaction, run_id: str, first_sequence: int, events: list[EventSpec]) -> None:
    """Insert events with consecutive sequences; a failure aborts the caller's transaction."""
    rows = [
        repo.NewEvent(
            event_id=new_id(),
            sequence=first_sequence + offset,
            type=ev.type,
            dedupe_key=ev.dedupe_key,
            actor_type=ev.actor_type,
            actor_id=ev.actor_id,
            attempt_id=ev.attempt_id,
            payload_json=event_payload_json(ev.payload),
        )
        for offset, ev in enumerate(events)
    ]
    repo.insert_events(tx, run_id=run_id, events=rows, now=tx.now_ms())


def lock_run(tx: Transaction, run_id: str) -> Run:
    run = repo.lock_run(tx, run_id)
    if run is None:
        raise NotFound("run not found")
    return run


def lock_attempt(tx: Transaction, attempt_id: str) -> Attempt:
    attempt = repo.lock_attempt(tx, attempt_id)
    if attempt is None:
        raise NotFound("attempt not found")
    return attempt


def latest_attempt(tx: Transaction, run_id: str) -> Attempt | None:
    return repo.latest_attempt(tx, run_id)


def write_run(
    tx: Transaction,
    current: Run,
    new: Run,
    events: list[EventSpec],
    attempt_change: AttemptChange | None = None,
    *,
    late_fact: bool = False,
) -> Run:
    """One Run change: CAS on the version, bump the event sequence, optional Attempt CAS, events.

    The caller's transaction rolls all of it back if any step fails. ``late_fact``: the one change a
    terminal Run takes, an attempt's late fact (``states.LATE_FACT_CORRECTIONS``,
    application/late_facts.py).
    """
    if late_fact and late_fact_correction_allowed(current.status, new.status):
        pass
    elif new.status != current.status:
        if is_run_terminal(current.status):
            raise InvalidRunTransition("the run is already terminal", status=current.status)
        if not run_transition_allowed(current.status, new.status):
            raise InvalidRunTransition(status=current.status, to=new.status)
    elif is_run_terminal(current.status):
        raise InvalidRunTransition("the run is already terminal", status=current.status)
    written = replace(new, version=current.version + 1, event_sequence=current.event_sequence + len(events))
    run_params = repo.run_cas_params(current, written)
    one_statement = _one_statement_write(tx, current, run_params, events, attempt_change)
    if one_statement is not None:
        outcome = repo.write_run_in_one_statement(tx, one_statement)
        if outcome == "run_conflict":
            raise RunVersionConflict(expected_version=current.version)
        if outcome == "attempt_conflict":
            raise Conflict("the attempt changed concurrently")
        if outcome != "written":
            raise Conflict("the run write answered out of turn", outcome=outcome)
    else:
        # Only the version and the event sequence move when no column the CAS sets changes (compared
        # on the parameters themselves: no second copy of the Run is built for it).
        same = repo.run_cas_sets_only_sequence(current, run_params)
        if not repo.update_run(tx, run_params, sequence_only=same):
            raise RunVersionConflict(expected_version=current.version)
        if attempt_change is not None:
            write_attempt(tx, attempt_change.attempt, attempt_change.new)
        append_events(tx, current.id, current.event_sequence + 1, events)
    if written.status != current.status:
        notifications.on_run_status(tx, written)  # the outbox row commits with the outcome
    return written


def _one_statement_write(
    tx: Transaction,
    current: Run,
    run_params: dict[str, Any],
    events: list[EventSpec],
    attempt_change: AttemptChange | None,
) -> dict[str, Any] | None:
    """On PostgreSQL, the parameters of ``ql3_write_run`` (migration 0011): the Run CAS, the Attempt
    CAS and the events of ``write_run`` in one round trip instead of three or more. None on SQLite,
    and whenever an attempt transition or an event payload is refused: the statements then run one by
    one and refuse it in their own order (a stale Run version first)."""
    if tx.dialect != "postgres":
        return None
    attempt: dict[str, Any] | None = None
    if attempt_change is not None:
        old, new = attempt_change.attempt, attempt_change.new
        if new.status != old.status and not attempt_transition_allowed(old.status, new.status):
            return None
        attempt = repo.attempt_cas_params(old, new)
    try:
        rows_ = [
            {
                "id": new_id(),
                "sequence": current.event_sequence + 1 + offset,
                "type": ev.type,
                "dedupe_key": ev.dedupe_key,
                "actor_type": ev.actor_type,
                "actor_id": ev.actor_id,
                "attempt_id": ev.attempt_id,
                "payload_json": event_payload_json(ev.payload),
            }
            for offset, ev in enumerate(events)
        ]
    except ValidationFailed:
        return None
    # The function stamps the rows with the same transaction clock (ql3_now_ms) as the statements.
    return {
        "run_json": json.dumps(run_params),
        "attempt_json": None if attempt is None else json.dumps(attempt),
        "events_json": json.dumps(rows_),
    }


def write_attempt(tx: Transaction, current: Attempt, new: Attempt) -> Attempt:
    if new.status != current.status and not attempt_transition_allowed(current.status, new.status):
        raise InvalidRunTransition(
            "the attempt cannot move to that status", status=current.status, to=new.status
        )
    if not repo.update_attempt(tx, current, new):
        raise Conflict("the attempt changed concurrently")
    return new


def transition(
    tx: Transaction,
    run_id: str,
    expected_version: int,
    to: str,
    *,
    actor_type: str,
    actor_id: str | None = None,
    **fields: Any,
) -> Run:
    """Move a Run to ``to`` if it is still at ``expected_version``; appends ``run.<to>``."""
    current = lock_run(tx, run_id)
    if current.version != expected_version:
        raise RunVersionConflict(expected_version=expected_version)
    new = replace(current, status=to, **fields)
    return write_run(
        tx,
        current,
        new,
        [
            EventSpec(
                type=f"run.{to}",
                actor_type=actor_type,
                actor_id=actor_id,
                payload={"from": current.status, "to": to},
                dedupe_key=f"run-transition:{expected_version}:{to}",
            )
        ],
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateRun:
    """One typed input for run creation, built by HTTP, CLI, cron and approved actions alike."""

    project_id: str
    task: Task
    # The spec of ``task.revision`` when the caller has read it in this transaction already (the API's
    # run creation); None: create_run reads it.
    spec: TaskSpec | None = None
    trigger_type: str = "manual"
    trigger_id: str | None = None
    idempotency_key: str | None = None
    priority: int = 0
    request_id: str | None = None
    retry_of_run_id: str | None = None
    scheduled_for_ms: int | None = None
    actor_type: str = "user"
    actor_id: str | None = None


# Keys the server itself uses (``ql3:cron:v1:...``, application/schedules.py ``cron_key``): a caller
# who could take one in advance would suppress a cron fire while the task shows enabled.
RESERVED_KEY_PREFIX: Final = "ql3:"
REQUEST_DIGEST_DOMAIN: Final = "ql3.run.request.v1"


def validate_idempotency_key(key: str | None) -> str | None:
    """A caller's key: 1-255 characters without control characters, never under the reserved ``ql3:``."""
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or any(ord(c) < 32 for c in key):
        raise ValidationFailed("invalid idempotency key", field="idempotency_key")
    if key[: len(RESERVED_KEY_PREFIX)].lower() == RESERVED_KEY_PREFIX:
        raise ReservedIdempotencyKey(field="idempotency_key")
    return key


def request_digest(cmd: CreateRun) -> str:
    """What a repeat of an idempotency key must repeat to be the same request: the task, the priority
    and the run it re-runs (a task edited in between does not make it another request)."""
    payload = canonical_json(
        {"task_id": cmd.task.id, "priority": cmd.priority, "retry_of_run_id": cmd.retry_of_run_id}
    )
    return domain_digest(REQUEST_DIGEST_DOMAIN, payload)


def _replay(cmd: CreateRun, found: tuple[Run, str | None]) -> Run:
    """The run a repeated key names, when the repeat is the same request; else ``IdempotencyConflict``."""
    run, digest = found
    if run.task_id != cmd.task.id or (digest is not None and not digest_equals(digest, request_digest(cmd))):
        raise IdempotencyConflict()
    return run


def create_run(tx: Transaction, cmd: CreateRun) -> tuple[Run, bool]:
    """Create a queued Run with its first (claimed) Attempt and two events.

    Returns ``(run, True)`` for a new run, ``(existing, False)`` when the idempotency key was already
    used in this project for the same task; the unique index is the final arbiter under races.
    """
    if not -(2**31) <= cmd.priority < 2**31:
        raise ValidationFailed("priority out of range", field="priority")
    if cmd.trigger_type == "manual" and not cmd.task.enabled:
        # A replay of an earlier request still answers with its run; a new run is refused.
        earlier = None
        if cmd.idempotency_key is not None:
            earlier = repo.get_idempotent_run(tx, cmd.project_id, cmd.idempotency_key)
        if earlier is None or earlier[0].task_id != cmd.task.id:
            raise TaskDisabled()
        return _replay(cmd, earlier), False
    now = tx.now_ms()
    run_id = new_id()
    inserted = repo.insert_run(
        tx,
        run_id=run_id,
        project_id=cmd.project_id,
        task_id=cmd.task.id,
        task_revision=cmd.task.revision,
        trigger_type=cmd.trigger_type,
        trigger_id=cmd.trigger_id,
        priority=cmd.priority,
        idempotency_key=cmd.idempotency_key,
        request_digest=None if cmd.idempotency_key is None else request_digest(cmd),
        request_id=cmd.request_id,
        retry_of_run_id=cmd.retry_of_run_id,
        scheduled_for_ms=cmd.scheduled_for_ms,
        now=now,
    )
    if not inserted:
        if cmd.idempotency_key is None:
            raise Conflict("run id collision")
        existing = repo.get_idempotent_run(tx, cmd.project_id, cmd.idempotency_key)
        if existing is None:
            raise Conflict("run id collision")
        return _replay(cmd, existing), False
    attempt_id = new_id()
    repo.insert_attempt(
        tx,
        attempt_id=attempt_id,
        run_id=run_id,
        attempt=1,
        status="claimed",
        executor_type="local_process",
        now=now,
    )
    _insert_retry_policy(tx, cmd.task, run_id, cmd.spec)
    current = repo.get_run(tx, run_id)
    assert current is not None  # inserted above in this transaction
    payload = {"trigger_type": cmd.trigger_type, "task_revision": cmd.task.revision}
    if cmd.scheduled_for_ms is not None:
        payload["scheduled_for_ms"] = cmd.scheduled_for_ms
    if cmd.trigger_type == "approved_action":
        # The run's history names the approval and the dispatch that created it.
        payload["approval_request_id"] = cmd.request_id
        payload["dispatch_id"] = cmd.idempotency_key
    # created and queued are facts of this one transaction (event_sequence starts at 2, version at 0).
    append_events(
        tx,
        run_id,
        1,
        [
            EventSpec(type="run.created", actor_type=cmd.actor_type, actor_id=cmd.actor_id, payload=payload),
            EventSpec(type="run.queued", actor_type="system", attempt_id=attempt_id, payload={"attempt": 1}),
        ],
    )
    tx.notify(channels.RUNS)
    return current, True


def create_queued_runs(tx: Transaction, cmds: list[CreateRun]) -> list[bool]:
    """A page of new queued runs, each as ``create_run`` makes it (its first claimed attempt, its
    created and queued events, its retry policy), in a constant number of statements whatever the
    page's size. Every command names its spec and an idempotency key and is not a manual run (the
    scheduler's runs). Returns, per command, whether its run was created: one whose key is already
    taken is not, and the caller decides it alone with ``create_run`` (the existing run, or the
    conflict)."""
    now = tx.now_ms()
    rows: list[repo.NewQueuedRun] = []
    for cmd in cmds:
        if cmd.spec is None or cmd.idempotency_key is None or cmd.trigger_type == "manual":
            raise ValueError("a page of runs needs specs, idempotency keys and no manual run")
        if not -(2**31) <= cmd.priority < 2**31:
            raise ValidationFailed("priority out of range", field="priority")
        run_id, attempt_id = new_id(), new_id()
        payload: dict[str, Any] = {"trigger_type": cmd.trigger_type, "task_revision": cmd.task.revision}
        if cmd.scheduled_for_ms is not None:
            payload["scheduled_for_ms"] = cmd.scheduled_for_ms
        if cmd.trigger_type == "approved_action":
            payload["approval_request_id"] = cmd.request_id
            payload["dispatch_id"] = cmd.idempotency_key
        spec = cmd.spec
        retry = None
        if spec.max_attempts > 1 and spec.retry_safe:  # as _insert_retry_policy decides
            retry = {
                "max_attempts": spec.max_attempts,
                "retry_on_lost": 1,
                "safety": "idempotent",
                "backoff_min_ms": RETRY_BACKOFF_MIN_MS,
                "backoff_max_ms": RETRY_BACKOFF_MAX_MS,
            }
        events = (
            repo.NewEvent(
                event_id=new_id(),
                sequence=1,
                type="run.created",
                dedupe_key=None,
                actor_type=cmd.actor_type,
                actor_id=cmd.actor_id,
                attempt_id=None,
                payload_json=event_payload_json(payload),
            ),
            repo.NewEvent(
                event_id=new_id(),
                sequence=2,
                type="run.queued",
                dedupe_key=None,
                actor_type="system",
                actor_id=None,
                attempt_id=attempt_id,
                payload_json=event_payload_json({"attempt": 1}),
            ),
        )
        rows.append(
            repo.NewQueuedRun(
                run_id=run_id,
                attempt_id=attempt_id,
                project_id=cmd.project_id,
                task_id=cmd.task.id,
                task_revision=cmd.task.revision,
                trigger_type=cmd.trigger_type,
                trigger_id=cmd.trigger_id,
                priority=cmd.priority,
                idempotency_key=cmd.idempotency_key,
                request_digest=request_digest(cmd),
                request_id=cmd.request_id,
                retry_of_run_id=cmd.retry_of_run_id,
                scheduled_for_ms=cmd.scheduled_for_ms,
                events=events,
                retry=retry,
            )
        )
    inserted = repo.insert_queued_runs(tx, rows, now=now)
    if inserted:
        tx.notify(channels.RUNS)
    return [row.run_id in inserted for row in rows]


RETRY_BACKOFF_MIN_MS: Final = 1_000
RETRY_BACKOFF_MAX_MS: Final = 60_000


def _insert_retry_policy(tx: Transaction, task: Task, run_id: str, known: TaskSpec | None) -> None:
    """Written only in the run-create transaction, from the pinned revision. A run is retried only
    when its revision allows more than one attempt *and* its owner declared the command safe to run
    again (``retry_safe``, safety ``idempotent``); a revision whose safety is unknown is never retried."""
    spec = known if known is not None else build_spec(_revision_spec(tx, task.id, task.revision))
    if spec.max_attempts <= 1 or not spec.retry_safe:
        return
    repo.insert_retry_policy(
        tx,
        run_id=run_id,
        max_attempts=spec.max_attempts,
        retry_on_lost=True,
        safety="idempotent",
        backoff_min_ms=RETRY_BACKOFF_MIN_MS,
        backoff_max_ms=RETRY_BACKOFF_MAX_MS,
    )


def attempt_deadline_from_spec(tx: Transaction, spec: dict[str, Any]) -> int | None:
    """The absolute deadline of an attempt starting now: the pinned revision's timeout (a duration,
    from its ``spec`` the caller read in this transaction) from the transaction's clock, the one time
    authority (``ql3_now_ms()`` on PostgreSQL, the injected clock on SQLite). No worker or host clock
    takes part, so skew between them cannot move a timeout."""
    timeout_ms = build_spec(spec).timeout_ms
    return None if timeout_ms is None else tx.now_ms() + timeout_ms


def _revision_spec(tx: Transaction, task_id: str, revision: int) -> dict[str, Any]:
    found = task_repo.get_revision(tx, task_id, revision)
    if found is None:
        raise NotFound("task revision not found")
    return found.spec


def get_run(tx: Transaction, project_id: str, run_id: str) -> Run:
    run = repo.get_run_in_project(tx, project_id, run_id)
    if run is None:
        raise NotFound("run not found")
    return run


def encode_cursor(created_at_ms: int, run_id: str) -> str:
    raw = json.dumps([created_at_ms, run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        if len(cursor) > 200:
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not isinstance(value[0], int)
            or not isinstance(value[1], str)
        ):
            raise ValueError
        return int(value[0]), str(value[1])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed("invalid cursor", field="cursor") from exc


def list_runs(
    tx: Transaction, project_id: str, *, task_id: str | None, cursor: str | None, limit: int
) -> tuple[list[Run], str | None]:
    """Newest first, keyset paginated; reads ``limit + 1`` to know whether a next page exists."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    found = repo.list_runs(
        tx,
        project_id=project_id,
        task_id=task_id,
        cursor=decode_cursor(cursor) if cursor else None,
        limit=limit + 1,
    )
    runs = found[:limit]
    next_cursor = encode_cursor(runs[-1].created_at_ms, runs[-1].id) if len(found) > limit else None
    return runs, next_cursor


def list_events(tx: Transaction, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
    if not 1 <= limit <= 500 or after < 0:
        raise ValidationFailed("page out of range")
    return repo.list_events(tx, run_id, after=after, limit=limit)
