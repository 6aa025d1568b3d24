"""Properties of the pure rules, checked by hypothesis over many generated inputs rather than a few
hand-picked ones: backoff, cursors, ids, digests, short ids and the lease vocabulary."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ql3.cli.human import SHORT_ID, short_ids
from ql3.domain import cancellation as rules
from ql3.domain import leases as lease_rules
from ql3.domain.digests import canonical_json
from ql3.domain.errors import ValidationFailed
from ql3.domain.ids import is_id, new_id
from ql3.domain.offers import derive_lease_token

settings.register_profile("ql3", max_examples=200, deadline=None, derandomize=True)
settings.load_profile("ql3")

budgets = st.integers(1, rules.MAX_RETRY_MS).flatmap(
    lambda base: st.tuples(st.just(base), st.integers(base, rules.MAX_RETRY_MS))
)


@given(budgets, st.integers(1, 200))
def test_backoff_stays_within_its_budget_and_never_shrinks(budget: tuple[int, int], count: int) -> None:
    base, cap = budget
    delay = rules.backoff_ms(count, base, cap)
    assert base <= delay <= cap
    assert rules.backoff_ms(count + 1, base, cap) >= delay
    if count == 1:
        assert delay == base


@given(budgets, st.integers(-5, 0))
def test_backoff_refuses_a_count_below_one(budget: tuple[int, int], count: int) -> None:
    with pytest.raises(ValidationFailed):
        rules.backoff_ms(count, *budget)


uuid7s = st.integers(0, (1 << 48) - 1).flatmap(
    lambda ms: st.builds(
        lambda r, b: str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (r << 64) | (0b10 << 62) | b)),
        st.integers(0, 0xFFF),
        st.integers(0, (1 << 62) - 1),
    )
)
safe_ints = st.integers(0, 2**53 - 1)


@given(safe_ints, safe_ints, uuid7s)
def test_a_blocked_cursor_round_trips_exactly(a: int, b: int, run_id: str) -> None:
    snapshot, blocked = max(a, b), min(a, b)
    cursor = rules.BlockedCursor(snapshot_at_ms=snapshot, blocked_at_ms=blocked, run_id=run_id)
    text = rules.encode_blocked_cursor(cursor)
    assert rules.decode_blocked_cursor(text) == cursor


@given(st.text(max_size=300))
def test_a_cursor_that_was_not_encoded_by_us_is_refused_cleanly(text: str) -> None:
    try:
        cursor = rules.decode_blocked_cursor(text)
    except ValidationFailed as err:
        assert err.details == {"field": "cursor"}
    else:  # only a canonical encoding decodes
        assert rules.encode_blocked_cursor(cursor) == text


def test_ids_are_canonical_and_strictly_increasing() -> None:
    ids = [new_id() for _ in range(5_000)]
    assert all(is_id(i) for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_json_round_trips_compactly_in_the_given_key_order(value: Any) -> None:
    text = canonical_json(value)
    assert json.loads(text) == value
    assert canonical_json(json.loads(text)) == text  # a stored form re-encodes to the same bytes
    if isinstance(value, dict):
        assert list(json.loads(text)) == list(value)


@given(st.binary(min_size=32, max_size=32), uuid7s, st.integers(1, 10_000), st.integers(1, 10_000))
def test_a_lease_token_is_determined_by_its_generation(secret: bytes, attempt: str, g1: int, g2: int) -> None:
    first = derive_lease_token(secret, attempt, g1)
    assert derive_lease_token(secret, attempt, g1) == first
    assert (derive_lease_token(secret, attempt, g2) == first) == (g1 == g2)


@given(st.lists(uuid7s, min_size=1, max_size=40))
def test_short_ids_are_unique_prefixes_of_at_least_the_short_length(ids: list[str]) -> None:
    short = short_ids(ids)
    assert set(short) == set(ids)
    assert len(set(short.values())) == len(short)
    for full, cut in short.items():
        assert full.startswith(cut) and len(cut) >= min(SHORT_ID, len(full))
        assert not any(other != full and other.startswith(cut) for other in short)


@given(st.sampled_from(lease_rules.ALL), st.integers(-(10**7), 10**7))
def test_a_lease_range_accepts_exactly_its_integers(bounds: lease_rules.LeaseBounds, value: int) -> None:
    inside = bounds.min_ms <= value <= bounds.max_ms
    assert bounds.contains(value) == inside
    assert bounds.min_ms <= bounds.clamp(value) <= bounds.max_ms
    if inside:
        assert bounds.validate(value) == value and bounds.clamp(value) == value
    else:
        with pytest.raises(ValidationFailed):
            bounds.validate(value)
