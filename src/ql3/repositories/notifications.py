"""Notification channels, routing rules and the transactional outbox (application/notifications.py).

Only ``get_channel_target`` reads a channel's target or secret (for the delivery loop); every other
read of a channel leaves them out. The outbox's claim and settle are CAS updates fenced by the
attempt count (and the lease owner for a settle); they return whether they won.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ql3.domain.notifications import (
    CHANNEL_KINDS,
    DELIVERY_STATUSES,
    ChannelKind,
    ChannelTarget,
    DeliveryStatus,
)
from ql3.ports.storage import Row, Transaction

L = TypeVar("L", bound=str)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelView:
    """A channel as management surfaces show it: never its URL or secret."""

    id: str
    name: str
    kind: ChannelKind
    scheme: str
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredRule:
    id: str
    channel_id: str
    task_id: str  # "" routes every task of the project
    events: str  # the comma-separated events the rule routes
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    id: str
    channel_id: str
    event: str
    status: DeliveryStatus
    attempts: int
    last_error: str | None
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DueDelivery:
    id: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxMessage:
    """What a deliverer sends: the row's id, channel, event and JSON payload."""

    id: str
    channel_id: str
    event: str
    payload: dict[str, Any]


def _one_of(value: Any, allowed: tuple[L, ...], column: str) -> L:
    """A column the schema's CHECK bounds, as its Literal; anything else is a schema/code mismatch."""
    for choice in allowed:
        if value == choice:
            return choice
    raise ValueError(f"unexpected {column} value in storage")


def _channel(row: Row) -> ChannelView:
    return ChannelView(
        id=row["id"],
        name=row["name"],
        kind=_one_of(row["kind"], CHANNEL_KINDS, "notification_channels.kind"),
        scheme=row["scheme"],
        created_at_ms=int(row["created_at_ms"]),
    )


def _delivery(row: Row) -> Delivery:
    return Delivery(
        id=row["id"],
        channel_id=row["channel_id"],
        event=row["event"],
        status=_one_of(row["status"], DELIVERY_STATUSES, "notification_outbox.status"),
        attempts=int(row["attempts"]),
        last_error=row["last_error"],
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


def _count(row: Row | None) -> int:
    return 0 if row is None else int(row["n"])


# -- channels -----------------------------------------------------------------------------------------


def count_channels(tx: Transaction, project_id: str) -> int:
    return _count(tx.one("notify_channel_count", {"project_id": project_id}))


def insert_channel(
    tx: Transaction,
    *,
    channel_id: str,
    project_id: str,
    name: str,
    kind: ChannelKind,
    target: str,
    secret: str | None,
    scheme: str,
    now: int,
) -> bool:
    """False when the project already has a channel of that name (nothing written)."""
    params = {
        "id": channel_id,
        "project_id": project_id,
        "name": name,
        "kind": kind,
        "target": target,
        "secret": secret,
        "scheme": scheme,
        "now": now,
    }
    return tx.run("notify_channel_insert", params) == 1


def get_channel_by_name(tx: Transaction, project_id: str, name: str) -> ChannelView | None:
    row = tx.one("notify_channel_by_name", {"project_id": project_id, "name": name})
    return None if row is None else _channel(row)


def list_channels(tx: Transaction, project_id: str) -> list[ChannelView]:
    """The project's channels by name (at most 64: the schema allows fewer)."""
    return [_channel(r) for r in tx.all("notify_channel_list", {"project_id": project_id})]


def get_channel_target(tx: Transaction, channel_id: str) -> ChannelTarget | None:
    """The channel's target and secret: for the delivery loop only."""
    row = tx.one("notify_channel_target", {"id": channel_id})
    if row is None:
        return None
    return ChannelTarget(
        id=row["id"],
        kind=_one_of(row["kind"], CHANNEL_KINDS, "notification_channels.kind"),
        target=row["target"],
        secret=row["secret"],
    )


def delete_channel(tx: Transaction, project_id: str, channel_id: str) -> None:
    """The channel, its rules and its undelivered messages; delivered ones stay as history."""
    tx.run("notify_rules_delete_for_channel", {"channel_id": channel_id})
    tx.run("notify_outbox_drop_unsent", {"channel_id": channel_id})
    tx.run("notify_channel_delete", {"id": channel_id, "project_id": project_id})


# -- rules --------------------------------------------------------------------------------------------


def count_rules(tx: Transaction, project_id: str) -> int:
    return _count(tx.one("notify_rule_count", {"project_id": project_id}))


def insert_rule(
    tx: Transaction, *, rule_id: str, project_id: str, channel_id: str, task_id: str, events: str, now: int
) -> None:
    params = {
        "id": rule_id,
        "project_id": project_id,
        "channel_id": channel_id,
        "task_id": task_id,
        "events": events,
        "now": now,
    }
    tx.run("notify_rule_insert", params)


def list_rules(tx: Transaction, project_id: str) -> list[StoredRule]:
    """The project's rules, oldest first (at most 64)."""
    return [
        StoredRule(
            id=r["id"],
            channel_id=r["channel_id"],
            task_id=str(r["task_id"]),
            events=str(r["events"]),
            created_at_ms=int(r["created_at_ms"]),
        )
        for r in tx.all("notify_rules_for_project", {"project_id": project_id})
    ]


def delete_rule(tx: Transaction, project_id: str, rule_id: str) -> bool:
    """False when the project has no such rule."""
    return tx.run("notify_rule_delete", {"id": rule_id, "project_id": project_id}) == 1


def get_task_name(tx: Transaction, task_id: str) -> str | None:
    """The name of a task, deleted or not (a message names the task of its outcome)."""
    row = tx.one("task_get_any", {"id": task_id})
    return str(row["name"]) if row else None


# -- the outbox -----------------------------------------------------------------------------------------


def insert_outbox(
    tx: Transaction,
    *,
    delivery_id: str,
    project_id: str,
    channel_id: str,
    outcome_key: str,
    event: str,
    payload_json: str,
    now: int,
) -> bool:
    """A pending row due now; False when this channel already has the outcome (nothing written)."""
    params = {
        "id": delivery_id,
        "project_id": project_id,
        "channel_id": channel_id,
        "outcome_key": outcome_key,
        "event": event,
        "payload_json": payload_json,
        "now": now,
    }
    return tx.run("notify_outbox_insert", params) == 1


def get_delivery(tx: Transaction, project_id: str, delivery_id: str) -> Delivery | None:
    row = tx.one("notify_outbox_get_in_project", {"id": delivery_id, "project_id": project_id})
    return None if row is None else _delivery(row)


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    """A delivery in the project's history, with its channel's name (None once the channel is gone)."""

    delivery: Delivery
    channel_name: str | None


FIRST_PAGE_MS: Final = 2**62  # a created_at_ms above every stored one: the history's first page


def list_history(
    tx: Transaction, project_id: str, *, before_ms: int, before_id: str, limit: int
) -> list[HistoryEntry]:
    """The project's deliveries created before (``before_ms``, ``before_id``), newest first."""
    rows = tx.all(
        "notify_outbox_history",
        {"project_id": project_id, "before_ms": before_ms, "before_id": before_id, "limit": limit},
    )
    return [HistoryEntry(delivery=_delivery(r), channel_name=r["channel_name"]) for r in rows]


def get_outbox_message(tx: Transaction, delivery_id: str) -> OutboxMessage | None:
    row = tx.one("notify_outbox_get", {"id": delivery_id})
    if row is None:
        return None
    payload: dict[str, Any] = json.loads(row["payload_json"])
    return OutboxMessage(id=row["id"], channel_id=row["channel_id"], event=row["event"], payload=payload)


def list_due(tx: Transaction, *, now: int, limit: int) -> list[DueDelivery]:
    """Rows due by ``now`` (pending, or leased with an expired lease), oldest due first. PostgreSQL
    skips rows another replica has locked, so concurrent deliverers read disjoint pages."""
    return [
        DueDelivery(id=r["id"], attempts=int(r["attempts"]))
        for r in tx.all("notify_due_page", {"now": now, "limit": limit})
    ]


def claim_outbox(
    tx: Transaction,
    *,
    delivery_id: str,
    expected_attempts: int,
    owner: str,
    lease_expires_at_ms: int,
    now: int,
) -> bool:
    """Lease a due row and count the attempt, if its attempt count is still ``expected_attempts``."""
    params = {
        "id": delivery_id,
        "expected_attempts": expected_attempts,
        "owner": owner,
        "lease_expires_at_ms": lease_expires_at_ms,
        "now": now,
    }
    return tx.run("notify_outbox_claim", params) == 1


def settle_outbox(
    tx: Transaction,
    *,
    delivery_id: str,
    status: DeliveryStatus,
    due_at_ms: int | None,
    last_error: str | None,
    owner: str,
    expected_attempts: int,
    now: int,
) -> bool:
    """Record a delivery result, if ``owner`` still holds the lease of attempt ``expected_attempts``."""
    params = {
        "id": delivery_id,
        "status": status,
        "due_at_ms": due_at_ms,
        "last_error": last_error,
        "now": now,
        "owner": owner,
        "expected_attempts": expected_attempts,
    }
    return tx.run("notify_outbox_settle", params) == 1


def next_due_ms(tx: Transaction) -> int | None:
    """When the earliest pending row or lease falls due (None: nothing is waiting)."""
    row = tx.one("notify_next_due")
    due = None if row is None else row.get("due")
    return None if due is None else int(due)


def count_outcomes(tx: Transaction, project_id: str, prefix: str) -> int:
    """Distinct outcome keys starting with ``prefix`` (ASCII) in the project's outbox."""
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return _count(tx.one("notify_outbox_count_outcomes", {"project_id": project_id, "lo": prefix, "hi": hi}))
