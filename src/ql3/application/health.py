"""What ``/readyz`` asks the database: that it answers, and at which schema version."""

from __future__ import annotations

from ql3.ports.storage import Transaction
from ql3.repositories import schema


def schema_version(tx: Transaction) -> int:
    """The applied schema version. Reading the transaction's clock too proves the database answers
    (on PostgreSQL it is the database clock, ``ql3_now_ms()``)."""
    tx.now_ms()
    return schema.applied_version(tx)
