"""Database wrappers that put another writer, or a failure, between two units of one cycle.

A cycle of the dispatchers and the resolver is a sequence of transactions (``db.transaction``); these
wrappers count them, so a test can let a concurrent writer commit just before the n-th one, or make
the n-th one fail as busy storage, without reaching into the code under test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ql3.domain.errors import StorageBusy
from ql3.ports.storage import Transaction

T = TypeVar("T")


class Interleaved:
    """The database, with ``before(n)`` run just before its n-th transaction (1-based)."""

    def __init__(self, db: Any, before: Callable[[int], None]) -> None:
        self._db = db
        self._before = before
        self.units = 0

    def transaction(self, fn: Callable[[Transaction], T], *, write: bool = True) -> T:
        self.units += 1
        self._before(self.units)
        result: T = self._db.transaction(fn, write=write)
        return result


def before_unit(db: Any, n: int, other: Callable[[], None]) -> Interleaved:
    """``db`` with ``other()`` committed just before its n-th transaction."""

    def before(unit: int) -> None:
        if unit == n:
            other()

    return Interleaved(db, before)


class FailingUnit:
    """The database, except that its ``fail_at``-th transaction (1-based) fails as busy storage."""

    def __init__(self, db: Any, fail_at: int) -> None:
        self._db = db
        self._fail_at = fail_at
        self.units = 0

    def transaction(self, fn: Callable[[Transaction], T], *, write: bool = True) -> T:
        self.units += 1
        if self.units == self._fail_at:
            raise StorageBusy()
        result: T = self._db.transaction(fn, write=write)
        return result
