"""Aggregate counts for monitoring: labels are statuses only, never ids, names or error text."""

from __future__ import annotations

from typing import Final

from ql3.ports.storage import Transaction

FAMILIES: Final = {
    "runs": "metrics_runs_by_status",
    "workers": "metrics_workers_by_status",
    "cancellation_dispatches": "metrics_cancellations_by_status",
    "approved_actions": "metrics_actions_by_status",
}


def status_counts(tx: Transaction) -> dict[str, dict[str, int]]:
    """``{family: {status: count}}`` read in one transaction."""
    return {
        family: {str(r["status"]): int(r["n"]) for r in tx.all(query)} for family, query in FAMILIES.items()
    }
