"""The one lease vocabulary (domain/leases.py): every validator and setting reads its range from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ql3.application import settings
from ql3.application.dispatcher import DispatchBudget
from ql3.domain import approvals, cancellation
from ql3.domain import leases as lease_rules
from ql3.domain.errors import ValidationFailed

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"


@pytest.mark.parametrize("bounds", lease_rules.ALL, ids=lambda b: b.kind)
def test_edges_are_inclusive_and_outside_is_refused(bounds: lease_rules.LeaseBounds) -> None:
    assert bounds.validate(bounds.min_ms) == bounds.min_ms
    assert bounds.validate(bounds.max_ms) == bounds.max_ms
    for bad in (bounds.min_ms - 1, bounds.max_ms + 1, True, "30000", 30_000.0, None):
        with pytest.raises(ValidationFailed) as caught:
            bounds.validate(bad, field="x_ms")
        assert caught.value.details == {"field": "x_ms"}
        assert f"{bounds.min_ms}-{bounds.max_ms}" in caught.value.message
    with pytest.raises(ValidationFailed) as unnamed:
        bounds.validate(bounds.max_ms + 1)
    assert unnamed.value.details == {"field": "lease_ms"}  # the field named by default
    assert bounds.clamp(bounds.max_ms * 2) == bounds.max_ms
    assert bounds.clamp(0) == bounds.min_ms


def test_an_empty_or_non_positive_range_cannot_be_declared() -> None:
    for low, high in ((10, 9), (0, 10), (-1, 5)):
        with pytest.raises(ValueError, match=f"broken: empty lease range {low}-{high}"):
            lease_rules.LeaseBounds("broken", low, high)
    single = lease_rules.LeaseBounds("exact", 1, 1)
    assert single.validate(1) == 1 and not single.contains(2) and not single.contains(0)


def test_domain_validators_use_the_vocabulary() -> None:
    c, a = lease_rules.CANCELLATION, lease_rules.APPROVED_ACTION
    assert cancellation.validate_lease_ms(c.max_ms) == c.max_ms
    with pytest.raises(ValidationFailed):
        cancellation.validate_lease_ms(c.max_ms + 1)
    assert approvals.validate_lease_ms(a.min_ms) == a.min_ms
    with pytest.raises(ValidationFailed):
        approvals.validate_lease_ms(a.min_ms - 1)
    with pytest.raises(ValidationFailed):
        DispatchBudget(lease_ms=lease_rules.RUN.max_ms + 1)
    assert DispatchBudget(lease_ms=lease_rules.RUN.min_ms).lease_ms == lease_rules.RUN.min_ms


def test_settings_ranges_are_the_vocabulary() -> None:
    pairs = {
        settings.RUN_LEASE: lease_rules.RUN,
        settings.CANCEL_LEASE: lease_rules.CANCELLATION,
        settings.ACTION_LEASE: lease_rules.APPROVED_ACTION,
        settings.NOTIFY_LEASE: lease_rules.NOTIFICATION,
    }
    for env, bounds in pairs.items():
        assert (env.low, env.high) == (bounds.min_ms, bounds.max_ms), env.name
        assert bounds.contains(env.default), env.name


def test_no_module_declares_its_own_lease_range() -> None:
    """A second ``MIN_*LEASE*_MS``/``MAX_*LEASE*_MS`` outside domain/leases.py is a second vocabulary."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "domain" / "leases.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and "LEASE" in target.id
                    and target.id.startswith(("MIN_", "MAX_"))
                    and target.id.endswith("_MS")  # a duration; token sizes are not lease ranges
                ):
                    offenders.append(f"{path.relative_to(SRC)}:{target.id}")
    assert offenders == []
