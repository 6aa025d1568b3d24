"""An issued offer and the dispatcher's cached task spec never share mutable state: the offer's
ExecutionSpec is frozen (its environment a tuple), and changing the cached TaskSpec leaves it as
issued."""

from __future__ import annotations

import dataclasses

import pytest

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
    cached = d._cached_spec(task.id, task.revision)

    # The issued spec cannot be changed in place
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.spec.command = "rm -rf /"  # type: ignore[misc]
    first.spec.environment_map()["INJECTED"] = "x"  # a copy
    assert first.spec.environment == (("A", "1"), ("B", "2"))

    # When the cached spec is changed in place, the issued offer is as it was
    issued = first.to_json()
    cached.env["A"] = "changed"
    cached.env["INJECTED"] = "x"
    assert first.to_json() == issued and first.spec.digest() == first.spec_digest

    # and the next offer built from the (restored) cache carries the revision's values
    cached.env.clear()
    cached.env.update({"A": "1", "B": "2"})
    second = d.dispatch_once().offer
    assert second is not None and second.fence.run_id != first.fence.run_id
    assert (second.spec.environment, second.spec.command) == (first.spec.environment, "echo hello")
