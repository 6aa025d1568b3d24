"""Helpers the repositories share to turn a storage row's columns into typed record fields."""

from __future__ import annotations

from typing import TypeVar

from ql3.domain.choices import choose

L = TypeVar("L", bound=str)


def opt_int(value: object) -> int | None:
    """A nullable integer column (PostgreSQL BIGINT, SQLite INTEGER) as ``int | None``."""
    return None if value is None else int(str(value))


def one_of(value: object, allowed: tuple[L, ...], column: str) -> L:
    """A text column whose values the schema's CHECK constraint bounds, as its ``Literal`` type.

    A value outside ``allowed`` means the schema and the code disagree: it is refused with the column
    name rather than passed on as an unexpected state.
    """
    found = choose(value, allowed)
    if found is None:
        raise ValueError(f"unexpected {column} value in storage")
    return found
