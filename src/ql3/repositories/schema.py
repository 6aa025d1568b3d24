"""The database's own bookkeeping: which schema migration it has applied."""

from __future__ import annotations

from ql3.ports.storage import Transaction


def applied_version(tx: Transaction) -> int:
    """The highest applied migration, 0 on an empty database."""
    row = tx.one("schema_applied_version")
    return int(row["version"]) if row else 0
