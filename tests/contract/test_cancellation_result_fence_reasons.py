"""A cancellation result names why it is fenced when it names another run's attempt, an earlier attempt
of its run, or a run whose dispatch was never claimed."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import cancellation, leases
from ql3.domain.errors import FenceConflict
from tests.support.builders import count
from tests.support.cancellation_builders import claim, events, new_token, request, running_runs
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, start


def _record(harness: Harness, **args: Any) -> None:
    base: dict[str, Any] = {
        "owner": "sup-a",
        "token": new_token(),
        "expected_version": 1,
        "result": "termination_requested",
        "controller_ran": True,
    }
    harness.db.transaction(lambda tx: cancellation.record_result(tx, **(base | args)))


def test_a_result_naming_another_runs_attempt_is_a_run_mismatch(harness: Harness) -> None:
    project, (target, other) = running_runs(harness.db, 2)
    request(harness.db, project, target.run_id)
    held = claim(harness.db, target.run_id, owner="sup-a")
    n_events = len(events(harness.db, target.run_id))

    with pytest.raises(FenceConflict) as err:
        _record(harness, run_id=target.run_id, attempt_id=other.attempt_id, token=held.token)

    assert err.value.details["reason"] == "run_mismatch"
    assert len(events(harness.db, target.run_id)) == n_events


def test_a_result_for_a_dispatch_never_claimed_is_missing(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    with pytest.raises(FenceConflict) as err:
        _record(harness, run_id=fence.run_id, attempt_id=fence.attempt_id)

    assert err.value.details["reason"] == "missing"
    assert count(harness.db, "cancellation_dispatches") == 0


def test_a_result_naming_an_earlier_attempt_of_the_run_is_an_attempt_mismatch(harness: Harness) -> None:
    # Given a run whose first attempt was lost and whose second runs, with its stop claimed
    register(harness.db, lease_ms=600_000)
    project, _, (run,) = queued(harness.db, max_attempts=2, retry_safe=True)
    d = dispatcher(harness.db)
    first = d.dispatch_once().offer
    assert first is not None
    start(harness.db, first)
    assert harness.db.transaction(
        lambda tx: leases.mark_lost(tx, run.id, first.fence.attempt_id, error_code="X")
    )
    harness.advance_clock(3_600_000)
    assert harness.db.transaction(lambda tx: leases.admit_retry(tx, run.id)) is not None
    register(harness.db, lease_ms=600_000)  # the worker's session lapsed meanwhile: a new one
    second = d.dispatch_once().offer
    assert second is not None and second.fence.attempt_id != first.fence.attempt_id
    start(harness.db, second)
    request(harness.db, project, run.id)
    held = claim(harness.db, run.id, owner="sup-a")
    assert held.attempt_id == second.fence.attempt_id

    # When a result arrives naming the first attempt, under the holder's own lease
    with pytest.raises(FenceConflict) as err:
        _record(
            harness,
            run_id=run.id,
            attempt_id=first.fence.attempt_id,
            token=held.token,
            expected_version=held.dispatch_version,
        )

    # Then the dispatch, bound to the second attempt, fences it
    assert err.value.details["reason"] == "attempt_mismatch"
