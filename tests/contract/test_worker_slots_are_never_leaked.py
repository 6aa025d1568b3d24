"""Every path that ends an attempt frees the worker's slot: the busy counter always equals the
worker's ``leased`` leases, and a one-slot worker keeps placing runs after each ending."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ql3.application import cancellation, cancellation_supervisor, lease_expiry, lease_results
from ql3.domain.offers import LeaseFence
from tests.support.cancellation_builders import FakeSignal, request, start_fence
from tests.support.databases import Harness
from tests.support.execution_builders import busy_and_leased, dispatcher, queued, register

LONG_MS = 600_000
SHORT_MS = 5_000


def _assert_consistent(harness: Harness) -> None:
    for worker_id, busy, leased in busy_and_leased(harness.db):
        assert busy == leased, f"worker {worker_id}: busy {busy} != leased leases {leased}"


def _complete(harness: Harness, fence: LeaseFence, exit_code: int = 0) -> Any:
    return harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=exit_code
        )
    )


def _supervise(harness: Harness) -> None:
    cancellation_supervisor.CancellationSupervisor(harness.db, signal=FakeSignal(), owner="sup-a").run_cycle()


def _completion(h: Harness, project: Any, fence: LeaseFence) -> None:
    start_fence(h.db, fence)
    assert _complete(h, fence)[0] == "applied"


def _start_failure(h: Harness, project: Any, fence: LeaseFence) -> None:
    h.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    h.db.transaction(lambda tx: lease_results.ack_start_failure(tx, fence, error_code="ENOENT"))


def _cancel_before_start(h: Harness, project: Any, fence: LeaseFence) -> None:
    # The attempt is claimed but never started: the supervisor ends it with finalize_unstarted.
    request(h.db, project, fence.run_id)
    _supervise(h)


def _cancel_after_start(h: Harness, project: Any, fence: LeaseFence) -> None:
    start_fence(h.db, fence)
    request(h.db, project, fence.run_id)
    _supervise(h)
    assert h.db.transaction(lambda tx: cancellation.finalize_stopped(tx, fence.run_id)) == "cancelled"


def _stop_then_late_completion(h: Harness, project: Any, fence: LeaseFence) -> None:
    _cancel_after_start(h, project, fence)
    # The receipt that turns up after the stop ended the attempt is still its fact (its exit code,
    # docs/contracts.md §2.4): it changes no state, and frees no slot a second time.
    assert _complete(h, fence, exit_code=143)[0] == "applied"
    assert _complete(h, fence, exit_code=143)[0] == "already_terminal"


def _timeout(h: Harness, project: Any, fence: LeaseFence) -> None:
    start_fence(h.db, fence)  # the task's 1 s timeout is the deadline, on the database clock
    h.advance_clock(2_000)
    assert cancellation.timeout_cycle(h.db).requested == 1
    _supervise(h)
    assert h.db.transaction(lambda tx: cancellation.finalize_stopped(tx, fence.run_id)) == "timed_out"


def _lost(h: Harness, project: Any, fence: LeaseFence) -> None:
    start_fence(h.db, fence)
    assert h.db.transaction(
        lambda tx: lease_expiry.mark_lost(
            tx, fence.run_id, fence.attempt_id, error_code="X", actor_type="worker"
        )
    )


def _expire_all(h: Harness) -> None:
    for attempt_id in h.db.transaction(lambda tx: lease_expiry.expired_page(tx, 16), write=False):
        h.db.transaction(lambda tx, a=attempt_id: lease_expiry.expire_lease(tx, a))


def _lease_expiry_unstarted(h: Harness, project: Any, fence: LeaseFence) -> None:
    h.advance_clock(SHORT_MS + 1)
    _expire_all(h)


def _lease_expiry_started(h: Harness, project: Any, fence: LeaseFence) -> None:
    start_fence(h.db, fence)
    _lease_expiry_unstarted(h, project, fence)


def _session_replacement(h: Harness, project: Any, fence: LeaseFence) -> None:
    start_fence(h.db, fence)
    register(h.db, slots=1, lease_ms=LONG_MS)  # a new session fences the old one's leases
    h.advance_clock(SHORT_MS + 1)
    _expire_all(h)


PATHS: dict[str, Callable[[Harness, Any, LeaseFence], None]] = {
    "completion": _completion,
    "start_failure": _start_failure,
    "cancel_before_start": _cancel_before_start,
    "cancel_after_start": _cancel_after_start,
    "stop_then_late_completion": _stop_then_late_completion,
    "timeout": _timeout,
    "lost": _lost,
    "lease_expiry_unstarted": _lease_expiry_unstarted,
    "lease_expiry_started": _lease_expiry_started,
    "session_replacement": _session_replacement,
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_ending_path_frees_the_worker_slot(harness: Harness, path: str) -> None:
    # Given a one-slot worker holding one claimed run and another run waiting behind it
    register(harness.db, slots=1, lease_ms=LONG_MS)
    project, _, _ = queued(harness.db, 2, **({"timeout_ms": 1_000} if path == "timeout" else {}))
    d = dispatcher(harness.db, lease_ms=SHORT_MS)
    first = d.dispatch_once()
    assert first.offer is not None
    assert d.dispatch_once().reason == "no_capacity"
    _assert_consistent(harness)

    # When the attempt ends by this path
    PATHS[path](harness, project, first.offer.fence)

    # Then the busy counter equals the leased leases, and the slot places the next run
    _assert_consistent(harness)
    assert busy_and_leased(harness.db)[-1][1] == 0
    nxt = d.dispatch_once()
    assert nxt.reason == "claimed" and nxt.offer is not None
    _assert_consistent(harness)
