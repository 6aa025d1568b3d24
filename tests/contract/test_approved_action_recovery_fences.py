"""The resolver's acquisition of a recovery control re-checks, under the row lock, what its due page
saw: a row another resolver holds (a live resolver lease) or has moved to the manual queue since the
page was read is skipped, never taken over. And each finding schedules the next scan by the number of
scans so far (30 s, then 60 s, ...), on the database clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from ql3.application.approved_action_handlers import Evidence, RunCreateHandler
from ql3.application.approved_action_recovery import RecoveryResolver
from ql3.domain.approvals import Dispatch, Execution, rescan_delay_ms
from ql3.ports.storage import Database
from tests.support.approval_builders import (
    LEASE_MS,
    ManualOnlyHandler,
    dispatched,
    recovery_row,
    started,
    world,
)
from tests.support.databases import Harness
from tests.support.interleaving import before_unit


@dataclass
class StillRunning:
    action_type: str = "run.create"
    recovery_mode: str = "automatic"
    probed: int = 0

    def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
        self.probed += 1
        return Evidence(finding="still_running")


@dataclass
class Crashing:
    """A resolver process that dies while probing: its resolver lease stays behind, live."""

    action_type: str = "run.create"
    recovery_mode: str = "automatic"

    def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
        raise SystemExit("resolver-a lost power")


def _resolver(db: Any, providers: list[Any], owner: str) -> RecoveryResolver:
    return RecoveryResolver(db, providers, owner)


def _lapsed(harness: Harness) -> str:
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)
    return dispatch.id


def test_a_row_another_resolver_acquired_after_the_page_was_read_is_skipped(harness: Harness) -> None:
    # Given resolver B read the due page (unit 1), then resolver A acquired the row and died while probing
    dispatch_id = _lapsed(harness)

    def a_acquires_and_dies() -> None:
        with pytest.raises(SystemExit):
            _resolver(harness.db, [Crashing()], "resolver-a").resolve_batch()

    provider = StillRunning()
    b = _resolver(before_unit(harness.db, 2, a_acquires_and_dies), [provider], "resolver-b")

    # When B goes on to acquire the row it saw due
    report = b.resolve_batch()

    # Then A's live resolver lease wins: B skips it, probes nothing and writes nothing
    assert [i.outcome for i in report.items] == ["skipped"] and provider.probed == 0
    control = recovery_row(harness.db, dispatch_id)
    assert control is not None and (control["resolver_owner"], control["scan_count"]) == ("resolver-a", 1)


def test_a_row_moved_to_the_manual_queue_after_the_page_was_read_is_skipped(harness: Harness) -> None:
    dispatch_id = _lapsed(harness)

    def a_hands_it_to_a_person() -> None:
        _resolver(harness.db, [ManualOnlyHandler()], "resolver-a").resolve_batch()

    provider = StillRunning()
    b = _resolver(before_unit(harness.db, 2, a_hands_it_to_a_person), [provider], "resolver-b")

    report = b.resolve_batch()

    assert [i.outcome for i in report.items] == ["skipped"] and provider.probed == 0
    control = recovery_row(harness.db, dispatch_id)
    assert control is not None and (control["status"], control["resolver_owner"]) == ("manual", None)


def test_each_finding_schedules_the_next_scan_by_the_number_of_scans(harness: Harness) -> None:
    dispatch_id = _lapsed(harness)
    resolver = _resolver(harness.db, [RunCreateHandler()], "resolver-a")
    delays = []
    for _ in range(3):
        assert [i.outcome for i in resolver.resolve_batch().items] == ["missing"]
        control = recovery_row(harness.db, dispatch_id)
        assert control is not None
        # the finding's write sets both from the one database instant it read
        delays.append(int(control["next_scan_at_ms"]) - int(control["updated_at_ms"]))
        harness.advance_clock(int(control["next_scan_at_ms"]) - harness.now_ms())

    assert delays == [rescan_delay_ms(1), rescan_delay_ms(2), rescan_delay_ms(3)] == [30_000, 60_000, 120_000]
