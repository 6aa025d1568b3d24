"""Readers racing with publishing shims see either no receipt or the whole receipt, never a part."""

from __future__ import annotations

import threading

from ql3.execution.receipts import Receipt, ReceiptInvalid
from tests.support.processes import ExecHarness

RUNS = 40


def test_concurrent_readers_never_see_a_partial_receipt(ex: ExecHarness) -> None:
    # Given a reader that polls every attempt's receipt as fast as it can
    attempt_ids = [f"att-race-{i}" for i in range(RUNS)]
    seen: dict[str, Receipt] = {}
    invalid: list[ReceiptInvalid] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() and len(seen) < RUNS:
            for attempt_id in attempt_ids:
                if attempt_id in seen:
                    continue
                try:
                    receipt = ex.receipt(attempt_id)
                except ReceiptInvalid as exc:
                    invalid.append(exc)
                    continue
                if receipt is not None:
                    seen[attempt_id] = receipt

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        # When many shims publish their receipts meanwhile
        for i, attempt_id in enumerate(attempt_ids):
            ex.shell(attempt_id, f"exit {i}")
        for attempt_id in attempt_ids:
            ex.wait_exit(attempt_id)
    finally:
        reader.join(timeout=30)
        stop.set()
        reader.join()

    # Then every receipt was read whole and valid
    assert invalid == []
    assert {a: r.exit_code for a, r in seen.items()} == {a: i for i, a in enumerate(attempt_ids)}
