"""A manual resolution's mutation id replays only the exact same resolution: the same id with any
other decision, person, version or reason is a conflict, and the stored resolution stays as it was."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import approved_action_recovery
from ql3.domain.errors import Conflict
from ql3.domain.ids import new_id
from tests.support.approval_builders import LEASE_MS, dispatched, execution, started, user, world
from tests.support.databases import Harness


@pytest.mark.parametrize("changed", ["decision", "principal", "expected_execution_version", "reason_code"])
def test_a_resolution_replayed_with_one_field_changed_is_a_conflict(harness: Harness, changed: str) -> None:
    # Given a recovery_required action resolved by an approver
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)
    version = execution(harness.db, dispatch.id).version
    other = user(harness.db, w.project, "approver", "approver-2")
    first: dict[str, Any] = {
        "mutation_id": new_id(),
        "decision": "confirm_failed",
        "principal": w.approver,
        "expected_execution_version": version,
        "reason_code": "checked_downstream",
    }

    def resolve(args: dict[str, Any]) -> Any:
        return harness.db.transaction(
            lambda tx: approved_action_recovery.resolve_manually(
                tx, dispatch_id=dispatch.id, project_id=w.project.id, role="approver", **args
            )
        )

    done = resolve(first)
    before = harness.db.raw("SELECT * FROM approved_action_resolutions")
    assert resolve(first) == done

    # When the same mutation id comes back with one field changed
    alternatives = {
        "decision": "abandon_unknown",
        "principal": other,
        "expected_execution_version": version + 1,
        "reason_code": "looked_again",
    }
    with pytest.raises(Conflict):
        resolve(first | {changed: alternatives[changed]})

    # Then nothing changed
    assert harness.db.raw("SELECT * FROM approved_action_resolutions") == before
    assert execution(harness.db, dispatch.id) == done
