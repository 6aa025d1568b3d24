"""Narrowing a value to one of a fixed set of strings, typed as that set's ``Literal``."""

from __future__ import annotations

from typing import TypeVar

L = TypeVar("L", bound=str)


def choose(value: object, allowed: tuple[L, ...]) -> L | None:
    """The member of ``allowed`` equal to ``value``, or None when there is none."""
    return next((option for option in allowed if option == value), None)
