"""Runs, their attempts and their events, and the read models that list runs for people
(``application/run_queries.py``). The leases and the lost-retry cursor are in ``leases.py``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from ql3.domain.model import Attempt, Run, RunEvent
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import opt_int

STATUS_SLOTS: Final = 11  # the run_filter_page query's status placeholders, one per run status
# the statuses of the partial index runs_project_live (migrations 0025 / 0033): few rows at any time
LIVE_STATUSES: Final = frozenset(
    ("created", "queued", "dispatching", "running", "waiting_approval", "retry_wait", "lost")
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """A run with what a list shows beside it."""

    run: Run
    task_name: str | None
    trigger: str
    attempt: int | None = None


def run_from_row(row: Row) -> Run:
    return Run(
        id=row["id"],
        project_id=row["project_id"],
        task_id=row["task_id"],
        task_revision=int(row["task_revision"]),
        trigger_type=row["trigger_type"],
        status=row["status"],
        version=int(row["version"]),
        event_sequence=int(row["event_sequence"]),
        priority=int(row["priority"]),
        idempotency_key=row["idempotency_key"],
        created_at_ms=int(row["created_at_ms"]),
        queued_at_ms=row["queued_at_ms"],
        started_at_ms=row["started_at_ms"],
        finished_at_ms=row["finished_at_ms"],
        cancel_requested_at_ms=row["cancel_requested_at_ms"],
        cancel_reason=row["cancel_reason"],
        error_code=row["error_code"],
        exit_code=row["exit_code"],
        scheduled_for_ms=row["scheduled_for_ms"],
        request_id=row["request_id"],
    )


def attempt_from_row(row: Row) -> Attempt:
    return Attempt(
        id=row["id"],
        run_id=row["run_id"],
        attempt=int(row["attempt"]),
        status=row["status"],
        executor_type=row["executor_type"],
        worker_id=row["worker_id"],
        pid=row["pid"],
        executor_handle=row["executor_handle"],
        log_artifact_id=row["log_artifact_id"],
        deadline_at_ms=row["deadline_at_ms"],
        callback_token_hash=row["callback_token_hash"],
        callback_sequence=int(row["callback_sequence"]),
        created_at_ms=int(row["created_at_ms"]),
        started_at_ms=row["started_at_ms"],
        finished_at_ms=row["finished_at_ms"],
        exit_code=row["exit_code"],
        error_code=row["error_code"],
    )


def event_from_row(row: Row) -> RunEvent:
    return RunEvent(
        id=row["id"],
        run_id=row["run_id"],
        sequence=int(row["sequence"]),
        type=row["type"],
        actor_type=row["actor_type"],
        actor_id=row["actor_id"],
        attempt_id=row["attempt_id"],
        payload=json.loads(row["payload_json"]),
        created_at_ms=int(row["created_at_ms"]),
    )


def get_run_in_project(tx: Transaction, project_id: str, run_id: str) -> Run | None:
    row = tx.one("run_get_in_project", {"id": run_id, "project_id": project_id})
    return None if row is None else run_from_row(row)


def get_run_by_idempotency(tx: Transaction, project_id: str, idempotency_key: str) -> Run | None:
    """The project's run created under ``idempotency_key`` (unique per project)."""
    found = get_idempotent_run(tx, project_id, idempotency_key)
    return None if found is None else found[0]


def get_idempotent_run(
    tx: Transaction, project_id: str, idempotency_key: str
) -> tuple[Run, str | None] | None:
    """The project's run created under ``idempotency_key`` with the digest of the request that created
    it (None for a run created before digests were kept)."""
    row = tx.one("run_by_idempotency", {"project_id": project_id, "idempotency_key": idempotency_key})
    return None if row is None else (run_from_row(row), row["request_digest"])


def lock_attempt(tx: Transaction, attempt_id: str) -> Attempt | None:
    """The attempt read under the row lock its transaction holds to its end; None when there is none
    (the caller decides whether that is a NotFound or a fence refusal)."""
    row = tx.one("attempt_lock", {"id": attempt_id})
    return None if row is None else attempt_from_row(row)


def list_attempts(tx: Transaction, run_id: str) -> list[Attempt]:
    """The run's attempts in order (the query reads at most 64)."""
    return [attempt_from_row(row) for row in tx.all("attempt_list", {"run_id": run_id})]


# -- run lists for people --------------------------------------------------------------------------


def filter_runs(
    tx: Transaction,
    *,
    project_id: str,
    task_id: str | None,
    statuses: tuple[str, ...],
    trigger: str | None,
    since_ms: int | None,
    until_ms: int | None,
    cursor: tuple[int, str] | None,
    limit: int,
) -> list[RunRow]:
    """Newest first, after the ``(created_at_ms, id)`` cursor; at most ``limit`` rows. No status
    means any; at most STATUS_SLOTS statuses (the caller validates the filter)."""
    slots = list(statuses) + [None] * (STATUS_SLOTS - len(statuses))
    params: dict[str, Any] = {
        "project_id": project_id,
        "task_id": task_id,
        "any_status": 0 if statuses else 1,
        **{f"s{i}": value for i, value in enumerate(slots)},
        "trigger": trigger,
        "since_ms": since_ms,
        "until_ms": until_ms,
        "cursor_ms": None,
        "cursor_id": None,
        "limit": limit,
    }
    if cursor is not None:
        params["cursor_ms"], params["cursor_id"] = cursor
    return [
        RunRow(
            run=run_from_row(row),
            task_name=row.get("task_name"),
            trigger=str(row["trigger_kind"]),
            attempt=opt_int(row.get("attempt_count")),
        )
        for row in tx.all(_filter_query(task_id, statuses), params)
    ]


def _filter_query(task_id: str | None, statuses: tuple[str, ...]) -> str:
    # One plan per shape, so no filter reads the project's whole history to find a few rows: one
    # task's runs by the task's index, live runs by the live partial index, else by creation time.
    if task_id is not None:
        return "run_filter_task_page"
    if statuses and LIVE_STATUSES.issuperset(statuses):
        return "run_filter_live_page"
    return "run_filter_page"


def describe_run(tx: Transaction, run: Run) -> RunRow | None:
    """The list facts (task name, derived trigger, attempt count) for one run; None when its row is
    not there."""
    row = tx.one("run_filter_extras", {"id": run.id})
    if row is None:
        return None
    return RunRow(
        run=run,
        task_name=row.get("task_name"),
        trigger=str(row["trigger_kind"]),
        attempt=opt_int(row.get("attempt_count")),
    )


# -- runs ------------------------------------------------------------------------------------------


def get_run(tx: Transaction, run_id: str) -> Run | None:
    row = tx.one("run_get", {"id": run_id})
    return None if row is None else run_from_row(row)


def lock_run(tx: Transaction, run_id: str) -> Run | None:
    """The run read under the row lock its transaction holds to its end."""
    row = tx.one("run_lock", {"id": run_id})
    return None if row is None else run_from_row(row)


def insert_run(
    tx: Transaction,
    *,
    run_id: str,
    project_id: str,
    task_id: str,
    task_revision: int,
    trigger_type: str,
    trigger_id: str | None,
    priority: int,
    idempotency_key: str | None,
    request_id: str | None,
    retry_of_run_id: str | None,
    scheduled_for_ms: int | None,
    now: int,
    request_digest: str | None = None,
) -> bool:
    """A new queued run (version 0, event sequence 2: its created and queued events); False when the
    id or the project's idempotency key is taken (the unique index decides under races)."""
    inserted = tx.run(
        "run_insert",
        {
            "id": run_id,
            "project_id": project_id,
            "task_id": task_id,
            "task_revision": task_revision,
            "trigger_type": trigger_type,
            "trigger_id": trigger_id,
            "status": "queued",
            "priority": priority,
            "idempotency_key": idempotency_key,
            "request_digest": request_digest,
            "request_id": request_id,
            "retry_of_run_id": retry_of_run_id,
            "scheduled_for_ms": scheduled_for_ms,
            "queued_at_ms": now,
            "now": now,
        },
    )
    return inserted != 0


def run_cas_params(current: Run, written: Run) -> dict[str, Any]:
    """The columns a run write sets, fenced on the version the caller read (``run_cas`` and the
    ``run`` part of ``run_write``)."""
    return {
        "id": current.id,
        "expected_version": current.version,
        "status": written.status,
        "event_sequence": written.event_sequence,
        "queued_at_ms": written.queued_at_ms,
        "started_at_ms": written.started_at_ms,
        "finished_at_ms": written.finished_at_ms,
        "cancel_requested_at_ms": written.cancel_requested_at_ms,
        "cancel_reason": written.cancel_reason,
        "error_code": written.error_code,
        "exit_code": written.exit_code,
    }


_RUN_CAS_COLUMNS: Final = (
    "status",
    "queued_at_ms",
    "started_at_ms",
    "finished_at_ms",
    "cancel_requested_at_ms",
    "cancel_reason",
    "error_code",
    "exit_code",
)


def run_cas_sets_only_sequence(current: Run, run_params: dict[str, Any]) -> bool:
    """Whether a write with ``run_params`` (``run_cas_params``) leaves every column ``run_cas`` sets
    as ``current`` has it, but the version and the event sequence."""
    return all(run_params[name] == getattr(current, name) for name in _RUN_CAS_COLUMNS)


def update_run(tx: Transaction, run_params: dict[str, Any], *, sequence_only: bool = False) -> bool:
    """Compare-and-set on the version in ``run_params`` (``run_cas_params``); False when it moved.
    ``sequence_only``: the caller changes no column but the version and the event sequence, so the
    statement sets only those (``run_cas_sequence``, which maintains no index of the runs)."""
    if sequence_only:
        params = {
            "id": run_params["id"],
            "expected_version": run_params["expected_version"],
            "event_sequence": run_params["event_sequence"],
            "now": tx.now_ms(),
        }
        return tx.run("run_cas_sequence", params) == 1
    return tx.run("run_cas", {**run_params, "now": tx.now_ms()}) == 1


def write_run_in_one_statement(tx: Transaction, params: dict[str, Any]) -> str:
    """PostgreSQL only: ``ql3_write_run`` (migration 0011) with its ``run_json``, ``attempt_json`` and
    ``events_json``; answers ``written``, ``run_conflict`` or ``attempt_conflict``."""
    outcome = tx.one("run_write", params)
    assert outcome is not None  # a function call always answers one row
    return str(outcome["outcome"])


def insert_retry_policy(
    tx: Transaction,
    *,
    run_id: str,
    max_attempts: int,
    retry_on_lost: bool,
    safety: str,
    backoff_min_ms: int,
    backoff_max_ms: int,
) -> None:
    tx.run(
        "retry_policy_insert",
        {
            "run_id": run_id,
            "max_attempts": max_attempts,
            "retry_on_lost": int(retry_on_lost),
            "safety": safety,
            "backoff_min_ms": backoff_min_ms,
            "backoff_max_ms": backoff_max_ms,
        },
    )


def list_runs(
    tx: Transaction, *, project_id: str, task_id: str | None, cursor: tuple[int, str] | None, limit: int
) -> list[Run]:
    """Newest first (of one task when ``task_id``), after the ``(created_at_ms, id)`` cursor."""
    params: dict[str, Any] = {"project_id": project_id, "limit": limit, "task_id": task_id}
    prefix = "run_list_task" if task_id else "run_list"
    if cursor is not None:
        params["cursor_ms"], params["cursor_id"] = cursor
        found = tx.all(f"{prefix}_after", params)
    else:
        found = tx.all(f"{prefix}_first", params)
    return [run_from_row(row) for row in found]


# -- attempts --------------------------------------------------------------------------------------


def get_attempt(tx: Transaction, attempt_id: str) -> Attempt | None:
    """The attempt, read without a row lock."""
    row = tx.one("attempt_get", {"id": attempt_id})
    return None if row is None else attempt_from_row(row)


def latest_attempt(tx: Transaction, run_id: str) -> Attempt | None:
    row = tx.one("attempt_latest", {"run_id": run_id})
    return None if row is None else attempt_from_row(row)


def insert_attempt(
    tx: Transaction, *, attempt_id: str, run_id: str, attempt: int, status: str, executor_type: str, now: int
) -> None:
    tx.run(
        "attempt_insert",
        {
            "id": attempt_id,
            "run_id": run_id,
            "attempt": attempt,
            "status": status,
            "executor_type": executor_type,
            "now": now,
        },
    )


def attempt_cas_params(current: Attempt, new: Attempt) -> dict[str, Any]:
    """The columns an attempt write sets, fenced on the status and callback sequence the caller read
    (``attempt_cas`` and the ``attempt`` part of ``run_write``)."""
    return {
        "id": current.id,
        "expected_status": current.status,
        "expected_callback_sequence": current.callback_sequence,
        "status": new.status,
        "worker_id": new.worker_id,
        "pid": new.pid,
        "executor_handle": new.executor_handle,
        "log_artifact_id": new.log_artifact_id,
        "deadline_at_ms": new.deadline_at_ms,
        "callback_token_hash": new.callback_token_hash,
        "callback_sequence": new.callback_sequence,
        "started_at_ms": new.started_at_ms,
        "finished_at_ms": new.finished_at_ms,
        "exit_code": new.exit_code,
        "error_code": new.error_code,
    }


def update_attempt(tx: Transaction, current: Attempt, new: Attempt) -> bool:
    """Compare-and-set on the status and callback sequence of ``current``; False when either moved."""
    return tx.run("attempt_cas", attempt_cas_params(current, new)) == 1


# -- events ----------------------------------------------------------------------------------------


def insert_event(
    tx: Transaction,
    *,
    event_id: str,
    run_id: str,
    sequence: int,
    type: str,
    dedupe_key: str | None,
    actor_type: str,
    actor_id: str | None,
    attempt_id: str | None,
    payload_json: str,
    now: int,
) -> None:
    """One event; a taken ``(run_id, sequence)`` or dedupe key raises and aborts the transaction."""
    tx.run(
        "event_insert",
        {
            "id": event_id,
            "run_id": run_id,
            "sequence": sequence,
            "type": type,
            "dedupe_key": dedupe_key,
            "actor_type": actor_type,
            "actor_id": actor_id,
            "attempt_id": attempt_id,
            "payload_json": payload_json,
            "now": now,
        },
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """One event to append: its id, its sequence and what it says (``insert_events``)."""

    event_id: str
    sequence: int
    type: str
    dedupe_key: str | None
    actor_type: str
    actor_id: str | None
    attempt_id: str | None
    payload_json: str


def insert_events(tx: Transaction, *, run_id: str, events: list[NewEvent], now: int) -> None:
    """The events in order, two to a statement (``event_insert_pair``) and the last one alone when
    their number is odd; a taken ``(run_id, sequence)`` or dedupe key raises and aborts the
    transaction, as ``insert_event`` does."""
    for i in range(0, len(events) - 1, 2):
        first, second = events[i], events[i + 1]
        tx.run(
            "event_insert_pair",
            {
                "run_id": run_id,
                "now": now,
                "id": first.event_id,
                "sequence": first.sequence,
                "type": first.type,
                "dedupe_key": first.dedupe_key,
                "actor_type": first.actor_type,
                "actor_id": first.actor_id,
                "attempt_id": first.attempt_id,
                "payload_json": first.payload_json,
                "id_2": second.event_id,
                "sequence_2": second.sequence,
                "type_2": second.type,
                "dedupe_key_2": second.dedupe_key,
                "actor_type_2": second.actor_type,
                "actor_id_2": second.actor_id,
                "attempt_id_2": second.attempt_id,
                "payload_json_2": second.payload_json,
            },
        )
    if len(events) % 2:
        last = events[-1]
        insert_event(
            tx,
            event_id=last.event_id,
            run_id=run_id,
            sequence=last.sequence,
            type=last.type,
            dedupe_key=last.dedupe_key,
            actor_type=last.actor_type,
            actor_id=last.actor_id,
            attempt_id=last.attempt_id,
            payload_json=last.payload_json,
            now=now,
        )


def list_events(tx: Transaction, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
    found = tx.all("event_list", {"run_id": run_id, "after": after, "limit": limit})
    return [event_from_row(row) for row in found]


# -- the queue placement walks ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedCandidate:
    """A queued run with no stop intent, as the placement walk sees it, with its latest attempt."""

    run_id: str
    project_id: str
    task_id: str
    task_revision: int
    priority: int
    queued_at_ms: int
    attempt_id: str | None
    attempt_status: str | None
    # The latest attempt's executor type, which placement requires of a worker (ADR-0014 §2); empty
    # only for a run without an attempt, which is never placed.
    executor_type: str


def queued_candidates(
    tx: Transaction, *, after: tuple[int, int, str] | None, limit: int
) -> list[QueuedCandidate]:
    """Queue order (priority first, then oldest, then id), after the ``(priority, queued_at_ms,
    run_id)`` of the last candidate seen; at most ``limit``."""
    params: dict[str, Any] = {"limit": limit}
    if after is None:
        found = tx.all("candidate_first", params)
    else:
        params.update(c_priority=after[0], c_queued=after[1], c_id=after[2])
        found = tx.all("candidate_after", params)
    return [
        QueuedCandidate(
            run_id=row["run_id"],
            project_id=row["project_id"],
            task_id=row["task_id"],
            task_revision=int(row["task_revision"]),
            priority=int(row["priority"]),
            queued_at_ms=int(row["queued_at_ms"]),
            attempt_id=row["attempt_id"],
            attempt_status=row["attempt_status"],
            executor_type=row["executor_type"] or "",
        )
        for row in found
    ]


# -- a page of new runs at once (cron admission) ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewQueuedRun:
    """One queued run of a page written by ``insert_queued_runs``: the run, its first (claimed) attempt,
    its events (sequences from 1) and its retry policy when it has one."""

    run_id: str
    attempt_id: str
    project_id: str
    task_id: str
    task_revision: int
    trigger_type: str
    trigger_id: str | None
    priority: int
    idempotency_key: str
    request_digest: str
    request_id: str | None
    retry_of_run_id: str | None
    scheduled_for_ms: int | None
    events: tuple[NewEvent, ...]
    retry: dict[str, Any] | None  # max_attempts, retry_on_lost, safety, backoff_min_ms, backoff_max_ms


def insert_queued_runs(tx: Transaction, runs: list[NewQueuedRun], *, now: int) -> set[str]:
    """A page of queued runs in a constant number of statements (runs, attempts, events, retry
    policies: each one JSON array; on PostgreSQL all four in one statement, ``run_insert_page_all``).
    Returns the ids inserted: a run whose idempotency key is already taken is not inserted (nor its
    attempt, events or policy); the caller decides it alone."""
    if not runs:
        return set()
    body = json.dumps(
        [
            {
                "id": r.run_id,
                "project_id": r.project_id,
                "task_id": r.task_id,
                "task_revision": r.task_revision,
                "trigger_type": r.trigger_type,
                "trigger_id": r.trigger_id,
                "priority": r.priority,
                "idempotency_key": r.idempotency_key,
                "request_digest": r.request_digest,
                "request_id": r.request_id,
                "retry_of_run_id": r.retry_of_run_id,
                "scheduled_for_ms": r.scheduled_for_ms,
            }
            for r in runs
        ]
    )
    attempts = [{"id": r.attempt_id, "run_id": r.run_id} for r in runs]
    events = [
        {
            "id": e.event_id,
            "run_id": r.run_id,
            "sequence": e.sequence,
            "type": e.type,
            "dedupe_key": e.dedupe_key,
            "actor_type": e.actor_type,
            "actor_id": e.actor_id,
            "attempt_id": e.attempt_id,
            "payload_json": e.payload_json,
        }
        for r in runs
        for e in r.events
    ]
    policies = [{"run_id": r.run_id, **r.retry} for r in runs if r.retry is not None]
    attempt_columns = {"status": "claimed", "executor_type": "local_process", "now": now}
    if tx.dialect == "postgres":
        # One statement (its inserts joined to the runs it inserted): one round trip a page.
        params = {
            "runs": body,
            "attempts": json.dumps(attempts),
            "events": json.dumps(events),
            "policies": json.dumps(policies),
            **attempt_columns,
        }
        return {str(row["id"]) for row in tx.all("run_insert_page_all", params)}
    inserted = {str(row["id"]) for row in tx.all("run_insert_page", {"runs": body, "now": now})}
    if len(inserted) < len(runs):  # the rows of a run not inserted are not written
        attempts = [a for a in attempts if a["run_id"] in inserted]
        events = [e for e in events if e["run_id"] in inserted]
        policies = [p for p in policies if p["run_id"] in inserted]
    if attempts:
        tx.run("attempt_insert_page", {"attempts": json.dumps(attempts), **attempt_columns})
    if events:
        tx.run("event_insert_page", {"events": json.dumps(events), "now": now})
    if policies:
        tx.run("retry_policy_insert_page", {"policies": json.dumps(policies)})
    return inserted
