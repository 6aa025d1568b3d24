"""The storage port: short units of work over named, dialect-specific SQL."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
Row = dict[str, Any]
Params = Mapping[str, Any]


class Transaction(Protocol):
    """One open unit of work. Every statement runs inside it; nothing is visible before commit."""

    dialect: str

    def now_ms(self) -> int:
        """The transaction's observation time in epoch ms: the injected clock on SQLite, the
        database clock (``ql3_now_ms()``) on PostgreSQL. Constant within one transaction."""
        ...

    def one(self, query: str, params: Params | None = None) -> Row | None:
        """Run the named query and return its first row, or None."""
        ...

    def all(self, query: str, params: Params | None = None) -> list[Row]:
        """Run the named query and return all rows (every query that returns many rows is LIMITed)."""
        ...

    def run(self, query: str, params: Params | None = None) -> int:
        """Run the named statement and return the number of affected rows."""
        ...

    def notify(self, channel: str) -> None:
        """Wake listeners of ``channel`` after (and only if) this transaction commits."""
        ...


@runtime_checkable
class CommitsWithStatement(Protocol):
    """A transaction that can send its last statement together with its COMMIT (and with BEGIN when
    it is also the first): PostgreSQL, one round trip fewer per unit (``PostgresTransaction``)."""

    def one_then_commit(self, query: str, params: Params) -> Row | None:
        """Run the named query as the unit's last statement and commit with it; its first row. The
        caller writes nothing after it that must commit together with it: a further statement opens
        a new transaction. The query may take ``:origin`` (filled in here) and answer, in a
        ``notified`` column, the channels it sent ``pg_notify`` on with that payload: they are
        posted locally like ``notify``'s, and ``notify`` does not send them again."""
        ...

    def all_then_commit(self, query: str, params: Params) -> list[Row]:
        """``one_then_commit``, all the rows."""
        ...


@runtime_checkable
class Savepoints(Protocol):
    """A transaction that can undo part of itself: ``savepoint(fn)`` runs ``fn`` inside a savepoint;
    when ``fn`` raises, what it wrote is rolled back (the rest of the unit stays) and the exception
    is re-raised. A batch of independent steps in one unit uses it so that one step's refusal
    leaves the others' writes alone (both adapters)."""

    def savepoint(self, fn: Callable[[Transaction], T]) -> T: ...


class Database(Protocol):
    """A database handle shared by the threads of one process."""

    dialect: str

    def transaction(self, fn: Callable[[Transaction], T], *, write: bool = True) -> T:
        """Run ``fn`` in one transaction and commit. Any exception rolls everything back and is
        re-raised (driver errors translated to ql3 errors). Transient contention (SQLITE_BUSY,
        serialization failures) re-runs ``fn`` a bounded number of times from scratch, so a retry
        can never duplicate a write. ``write=False`` opens a read-only unit."""
        ...

    def wait_for(self, channel: str, timeout_s: float) -> bool:
        """Block until ``channel`` is notified or the timeout passes; True when notified."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
