"""A cancellation result names why it is fenced when it names another run's attempt, or a run whose
dispatch was never claimed; it writes nothing either way."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import cancellation
from ql3.domain.errors import FenceConflict
from tests.support.builders import count
from tests.support.cancellation_builders import claim, events, new_token, request, running_runs
from tests.support.databases import Harness


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
