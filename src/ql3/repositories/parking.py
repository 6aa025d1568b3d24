"""Parked items: the items a control loop failed to handle with a non-transient error
(application/parking.py, docs/operations.md "Parked items")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ql3.ports.storage import Row, Transaction


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedItem:
    """One parked item: which loop and item, why (a stable code, never a message), how often, when."""

    loop: str
    item_kind: str
    item_key: str
    project_id: str | None
    reason: str
    error_type: str | None
    failures: int
    first_failed_at_ms: int
    last_failed_at_ms: int
    next_retry_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedKey:
    item_kind: str
    item_key: str
    next_retry_at_ms: int


def _item(row: Row) -> ParkedItem:
    return ParkedItem(
        loop=str(row["loop"]),
        item_kind=str(row["item_kind"]),
        item_key=str(row["item_key"]),
        project_id=None if row["project_id"] is None else str(row["project_id"]),
        reason=str(row["reason"]),
        error_type=None if row["error_type"] is None else str(row["error_type"]),
        failures=int(row["failures"]),
        first_failed_at_ms=int(row["first_failed_at_ms"]),
        last_failed_at_ms=int(row["last_failed_at_ms"]),
        next_retry_at_ms=int(row["next_retry_at_ms"]),
    )


def park(
    tx: Transaction,
    *,
    loop: str,
    item_kind: str,
    item_key: str,
    project_id: str | None,
    reason: str,
    error_type: str | None,
    now_ms: int,
) -> int:
    """Insert the item's row (1 failure) or count one more failure on it; the failure count now. The
    row is locked (PostgreSQL) or the database write-locked (SQLite) until the transaction ends, so
    two concurrent parkers count two failures."""
    params: dict[str, Any] = {
        "loop": loop,
        "item_kind": item_kind,
        "item_key": item_key,
        "project_id": project_id,
        "reason": reason,
        "error_type": error_type,
        "now": now_ms,
    }
    row = tx.one("parked_upsert", params)
    assert row is not None  # an upsert with RETURNING always answers its row
    return int(row["failures"])


def set_retry(tx: Transaction, *, item_kind: str, item_key: str, next_retry_at_ms: int) -> None:
    tx.run(
        "parked_set_retry",
        {"item_kind": item_kind, "item_key": item_key, "next_retry_at_ms": next_retry_at_ms},
    )


def unpark(tx: Transaction, *, item_kind: str, item_key: str) -> bool:
    """Delete the item's row; whether there was one."""
    return tx.run("parked_delete", {"item_kind": item_kind, "item_key": item_key}) > 0


def keys_of_loop(tx: Transaction, loop: str, *, limit: int) -> list[ParkedKey]:
    return [
        ParkedKey(
            item_kind=str(r["item_kind"]),
            item_key=str(r["item_key"]),
            next_retry_at_ms=int(r["next_retry_at_ms"]),
        )
        for r in tx.all("parked_of_loop", {"loop": loop, "limit": limit})
    ]


def count_of_loop(tx: Transaction, loop: str) -> int:
    row = tx.one("parked_count_loop", {"loop": loop})
    return 0 if row is None else int(row["n"])


def evict_oldest(tx: Transaction, loop: str, *, limit: int) -> int:
    """Drop the loop's ``limit`` least recently failed rows; how many went."""
    return tx.run("parked_evict_oldest", {"loop": loop, "limit": limit})


def drop_stale(tx: Transaction, loop: str, *, before_ms: int) -> int:
    return tx.run("parked_drop_stale", {"loop": loop, "before": before_ms})


def list_project(tx: Transaction, project_id: str, *, limit: int) -> list[ParkedItem]:
    return [_item(r) for r in tx.all("parked_list_project", {"project_id": project_id, "limit": limit})]


def list_all(tx: Transaction, *, limit: int) -> list[ParkedItem]:
    return [_item(r) for r in tx.all("parked_list_all", {"limit": limit})]


def get(tx: Transaction, *, item_kind: str, item_key: str) -> ParkedItem | None:
    row = tx.one("parked_get", {"item_kind": item_kind, "item_key": item_key})
    return None if row is None else _item(row)


def retry_now(tx: Transaction, *, item_kind: str, item_key: str, now_ms: int) -> bool:
    return tx.run("parked_retry_now", {"item_kind": item_kind, "item_key": item_key, "now": now_ms}) > 0


def counts_by_loop_and_reason(tx: Transaction) -> dict[tuple[str, str], int]:
    return {(str(r["loop"]), str(r["reason"])): int(r["n"]) for r in tx.all("metrics_parked_counts")}


def project_of(tx: Transaction, *, item_kind: str, item_key: str) -> str | None:
    """The project the item belongs to, or None (the item is gone)."""
    row = tx.one("parked_item_project", {"item_kind": item_kind, "item_key": item_key})
    return None if row is None or row["project_id"] is None else str(row["project_id"])
