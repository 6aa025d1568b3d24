"""A run.create receipt proves success only when its stored evidence digest is the digest of its own
fields: a receipt whose stored digest disagrees is conflicting evidence, for the resolver and for a
handler that finds it on a second execute."""

from __future__ import annotations

import pytest

from ql3.application.approved_action_handlers import RunCreateHandler
from ql3.application.approved_action_recovery import RecoveryResolver
from ql3.domain.errors import Conflict
from tests.support.approval_builders import LEASE_MS, dispatched, execution, recovery_row, started, world
from tests.support.databases import Harness

FORGED = "f" * 64


def _forge_stored_digest(harness: Harness, dispatch_id: str) -> None:
    """Receipts are immutable (no UPDATE): replace the row by one that differs only in its digest."""
    (row,) = harness.db.raw(
        "SELECT * FROM approved_run_action_receipts WHERE dispatch_id = ?", (dispatch_id,)
    )
    assert row["evidence_digest"] != FORGED
    harness.db.raw("DELETE FROM approved_run_action_receipts WHERE dispatch_id = ?", (dispatch_id,))
    columns = [c for c in row if c != "evidence_digest"]
    harness.db.raw(
        f"INSERT INTO approved_run_action_receipts ({', '.join(columns)}, evidence_digest)"
        f" VALUES ({', '.join('?' for _ in columns)}, ?)",
        (*(row[c] for c in columns), FORGED),
    )


def test_a_receipt_whose_stored_digest_disagrees_sends_the_action_to_a_person(harness: Harness) -> None:
    # Given run.create executed (Run + receipt) and its completion lost, then the receipt's stored
    # digest replaced
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    RunCreateHandler().execute(harness.db, dispatch, fence)
    _forge_stored_digest(harness, dispatch.id)

    # When the handler runs again under the same barrier, it refuses the receipt
    with pytest.raises(Conflict):
        RunCreateHandler().execute(harness.db, dispatch, fence)

    # And when the lease lapses, the resolver does not resolve from it: a person must
    harness.advance_clock(LEASE_MS)
    report = RecoveryResolver(harness.db, [RunCreateHandler()], "resolver-a").resolve_batch()
    assert [item.outcome for item in report.items] == ["manual"]
    assert execution(harness.db, dispatch.id).status == "executing"
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and (control["status"], control["last_finding"]) == ("manual", "conflict")
