"""Aggregate counts for monitoring: labels are statuses only, never ids, names or error text."""

from __future__ import annotations

from ql3.ports.storage import Transaction
from ql3.repositories import metrics as repo


def status_counts(tx: Transaction) -> dict[str, dict[str, int]]:
    """``{family: {status: count}}`` read in one transaction."""
    return {family: repo.count_by_status(tx, family) for family in repo.STATUS_FAMILIES}
