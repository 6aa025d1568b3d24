"""The dispatcher's recovery walk (docs/dispatch.md, "Failing closed"): the live run leases an earlier
incarnation acquired, in expiry order. The queue's placement pages are in ``runs.py``
(``queued_candidates``), the workers' in ``workers.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ql3.ports.storage import Transaction


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoverableLease:
    """A ``leased`` run lease whose attempt is still ``claimed``, acquired at or before the walk's
    ``since``; ``(expires_at_ms, attempt_id)`` is the walk's keyset cursor."""

    attempt_id: str
    run_id: str
    expires_at_ms: int


def recoverable_leases(
    tx: Transaction, *, since: int, after: tuple[int, str] | None, limit: int
) -> list[RecoverableLease]:
    """Expiry order (then attempt id), after the ``(expires_at_ms, attempt_id)`` of the last lease
    seen; at most ``limit``."""
    params: dict[str, Any] = {"since": since, "limit": limit}
    if after is None:
        found = tx.all("lease_recovery_first", params)
    else:
        params["c_expires"], params["c_attempt"] = after
        found = tx.all("lease_recovery_after", params)
    return [
        RecoverableLease(
            attempt_id=str(row["attempt_id"]),
            run_id=str(row["run_id"]),
            expires_at_ms=int(row["expires_at_ms"]),
        )
        for row in found
    ]
