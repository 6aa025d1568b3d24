"""The column helpers the repositories share: a bounded text column becomes its ``Literal`` or is
refused by name, and a nullable integer stays None."""

from __future__ import annotations

import pytest

from ql3.domain.approvals import APPROVAL_STATES
from ql3.domain.auth import ROLES, as_role
from ql3.domain.choices import choose
from ql3.repositories.mapping import one_of, opt_int


def test_a_known_value_is_returned_as_the_member_of_its_set() -> None:
    assert one_of("approved", APPROVAL_STATES, "approval_requests.state") == "approved"
    assert choose("admin", ROLES) == "admin" and as_role("viewer") == "viewer"


@pytest.mark.parametrize("value", ["expired", "", "APPROVED", None, 2])
def test_a_value_outside_the_set_is_refused_by_column_name(value: object) -> None:
    assert choose(value, APPROVAL_STATES) is None
    with pytest.raises(ValueError, match=r"approval_requests\.state"):
        one_of(value, APPROVAL_STATES, "approval_requests.state")


def test_a_role_that_names_none_is_none() -> None:
    assert as_role("owner") is None and as_role(None) is None


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), (0, 0), ("17", 17), (1_800_000_000_000, 1_800_000_000_000)]
)
def test_a_nullable_integer_column(value: object, expected: int | None) -> None:
    assert opt_int(value) == expected
