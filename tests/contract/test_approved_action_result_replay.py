"""Approved-action results replay only when identical: the same mutation id with another outcome,
result code or digest is a conflict and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.domain.errors import Conflict
from ql3.domain.ids import new_id
from tests.support.approval_builders import complete, dispatched, execution, started, world
from tests.support.databases import Harness

DIGEST = "d" * 64
RESULT: dict[str, Any] = {"outcome": "succeeded", "result_code": "ok", "result_digest": DIGEST}


@pytest.mark.parametrize(
    "other",
    [
        {"outcome": "succeeded", "result_code": "other_code", "result_digest": DIGEST},
        {"outcome": "succeeded", "result_code": "ok", "result_digest": "e" * 64},
        {"outcome": "failed", "result_code": "ok"},
    ],
    ids=["result_code", "result_digest", "outcome"],
)
def test_the_same_mutation_id_with_another_result_is_a_conflict(
    harness: Harness, other: dict[str, Any]
) -> None:
    # Given an action whose result was recorded under a mutation id
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    mutation_id = new_id()
    done = complete(harness.db, fence, mutation_id=mutation_id, **RESULT)

    # When the same mutation id reports a different result, it conflicts
    with pytest.raises(Conflict):
        complete(harness.db, fence, mutation_id=mutation_id, **other)

    # Then nothing changed, and the exact result still replays
    assert execution(harness.db, dispatch.id) == done
    again = complete(harness.db, fence, mutation_id=mutation_id, **RESULT)
    assert again == done
