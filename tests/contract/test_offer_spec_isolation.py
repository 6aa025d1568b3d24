"""An issued offer and the dispatcher's cached task spec never share mutable state."""

from __future__ import annotations

import copy

from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register


def test_offers_of_one_cached_revision_are_independent_of_each_other_and_of_the_cache(
    harness: Harness,
) -> None:
    # Given two runs of one revision, placed by one dispatcher (the second from its cached spec)
    register(harness.db, slots=4)
    _, task, _ = queued(harness.db, 2, env={"A": "1", "B": "2"})
    d = dispatcher(harness.db)
    first = d.dispatch_once().offer
    assert first is not None
    issued = copy.deepcopy(first.spec)
    cached = d._cached_spec(task.id, task.revision)

    # When the first offer's spec is changed in place (environment and command)
    first.spec["environment"]["A"] = "changed"
    first.spec["environment"]["INJECTED"] = "x"
    first.spec["command"]["command"] = "rm -rf /"

    # Then the cached spec and the next offer built from it are untouched
    assert cached.env == {"A": "1", "B": "2"} and cached.command == "echo hello"
    second = d.dispatch_once().offer
    assert second is not None and second.fence.run_id != first.fence.run_id
    assert second.spec["environment"] == issued["environment"]
    assert second.spec["command"] == issued["command"]

    # And, the other way round, changing the cached spec leaves an issued offer as it was
    kept = copy.deepcopy(second.spec)
    cached.env["A"] = "changed"
    assert second.spec == kept
