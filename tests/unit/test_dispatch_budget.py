"""The dispatcher's per-cycle budgets (docs/dispatch.md, "Failing closed"): each bound is inclusive at
both ends, and a refusal names the setting and its range, so a bad configuration is refused at start-up
with the field an operator has to fix."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application.dispatcher import DispatchBudget
from ql3.domain.errors import ValidationFailed

PAGE_SIZES = ("recovery_page", "candidate_page", "worker_page")
PAGE_COUNTS = ("recovery_pages", "candidate_pages", "worker_pages")


def _refused(**budget: Any) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        DispatchBudget(**budget)
    return caught.value


@pytest.mark.parametrize("name", PAGE_SIZES)
def test_a_page_size_is_1_to_64(name: str) -> None:
    # 64 workers of one page is the most one placement reads
    alone = {"worker_pages": 1} if name == "worker_page" else {}
    assert getattr(DispatchBudget(**{name: 1}), name) == 1
    assert getattr(DispatchBudget(**{name: 64}, **alone), name) == 64
    for bad in (0, 65):
        refused = _refused(**{name: bad}, **alone)
        assert (refused.message, dict(refused.details)) == (f"{name} must be 1-64", {"field": name})


@pytest.mark.parametrize("name", PAGE_COUNTS)
def test_a_page_count_is_1_to_16(name: str) -> None:
    small = {"worker_page": 4} if name == "worker_pages" else {}
    assert getattr(DispatchBudget(**{name: 1}), name) == 1
    assert getattr(DispatchBudget(**{name: 16}, **small), name) == 16
    for bad in (0, 17):
        refused = _refused(**{name: bad}, **small)
        assert (refused.message, dict(refused.details)) == (f"{name} must be 1-16", {"field": name})


def test_one_placement_reads_at_most_64_workers() -> None:
    assert DispatchBudget(worker_page=8, worker_pages=8).worker_pages == 8
    assert DispatchBudget(worker_page=64, worker_pages=1).worker_page == 64
    refused = _refused(worker_page=13, worker_pages=5)  # 65
    assert (refused.message, dict(refused.details)) == (
        "at most 64 workers per placement",
        {"field": "worker_pages"},
    )


def test_the_claims_of_one_cycle_are_1_to_64() -> None:
    assert DispatchBudget(claims=1).claims == 1
    assert DispatchBudget(claims=64).claims == 64
    for bad in (0, 65):
        refused = _refused(claims=bad)
        assert (refused.message, dict(refused.details)) == ("claims must be 1-64", {"field": "claims"})
