"""Parked items (docs/operations.md "Parked items"): one bad item never stops a control loop.

A loop hands each item to ``ItemGuard.run``. An item whose handling fails with a *non-transient* error
is parked: recorded durably with the loop, the item's kind and id, a stable reason code (the
``Ql3Error`` code, or ``unexpected_error`` with the exception's type name; never the message, which
may carry data), the failure count, the first and last failure time and the next retry time (1 s
doubling to 15 min). The loop skips it until then and goes on with its other items in the same cycle;
a later success un-parks it. A *transient* error (the database is unavailable or busy: a ``Ql3Error``
with ``retryable``, anywhere in the exception's cause chain) is re-raised: it fails the whole cycle, so
the loop backs off and its health shows the outage.

Bounded: at most ``MAX_PARKED_PER_LOOP`` rows per loop (past it the least recently failed row is
dropped, so its item is simply tried again), and a row whose retry time passed ``STALE_AFTER_MS`` ago
without the loop meeting its item again is dropped (the item ended, expired or was deleted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ql3.domain.errors import NotFound, Ql3Error, ValidationFailed
from ql3.domain.model import Project
from ql3.ports import channels
from ql3.ports.storage import Database, Transaction
from ql3.repositories import parking as repo
from ql3.repositories.parking import ParkedItem

log = logging.getLogger("ql3.parking")

T = TypeVar("T")

# Item kinds and the loop (LifecycleRunner name) that handles them.
LOOP_OF_KIND: Final[dict[str, str]] = {
    "lease": "lease-expiry",  # an expired run lease, by attempt id
    "retry": "lease-expiry",  # a lost run due its retry, by run id
    "timeout": "cancellation",  # a started attempt past its deadline, by run id
    "stop": "cancellation",  # a due cancel intent the supervisor dispatches, by run id
    "finish": "cancellation",  # a stop a crash interrupted, by run id
    "approval": "approved-actions",  # an approved request to consume, by approval id
    "action": "approved-actions",  # a due approved action, by dispatch id
    "recovery": "approved-actions",  # a lapsed approved action to recover, by dispatch id
    "schedule": "cron",  # a due cron occurrence, by task id
    "delivery": "notifications",  # an outbox row to deliver, by delivery id
    "project": "retention",  # a project's retention pass, by project id
}
LOOPS: Final[tuple[str, ...]] = tuple(dict.fromkeys(LOOP_OF_KIND.values()))
# The channel each loop waits on: the retry-now action wakes it.
_LOOP_CHANNEL: Final[dict[str, str]] = {
    "lease-expiry": channels.RETRIES,
    "cancellation": channels.CANCELLATIONS,
    "approved-actions": channels.APPROVED_ACTIONS,
    "cron": channels.SCHEDULES,
    "notifications": channels.NOTIFICATIONS,
    "retention": channels.RETENTION,
}
BACKOFF_FIRST_MS: Final = 1_000
BACKOFF_MAX_MS: Final = 15 * 60 * 1000
MAX_PARKED_PER_LOOP: Final = 500
STALE_AFTER_MS: Final = 60 * 60 * 1000
MAX_LIST: Final = 200
UNEXPECTED: Final = "unexpected_error"
_MAX_CODE: Final = 64


def retry_delay_ms(failures: int) -> int:
    """1 s after the first failure, doubling, at most 15 min."""
    return int(min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** min(max(failures, 1) - 1, 20)))


def is_transient(exc: BaseException) -> bool:
    """A storage or connection outage: a retryable ``Ql3Error`` (``storage_unavailable``,
    ``storage_busy``) raised or chained as a cause/context. Everything else is the item's own."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Ql3Error) and current.retryable:
            return True
        current = current.__cause__ or current.__context__
    return False


def reason_of(exc: BaseException) -> tuple[str, str]:
    """The stable reason code and the exception's type name (both bounded, never the message)."""
    reason = exc.code if isinstance(exc, Ql3Error) else UNEXPECTED
    return reason[:_MAX_CODE], type(exc).__name__[:_MAX_CODE]


class Parked:
    """What ``ItemGuard.run`` answers for an item it parked or skipped instead of its handler's result."""

    __slots__ = ("skipped",)

    def __init__(self, *, skipped: bool) -> None:
        self.skipped = skipped


def park(
    tx: Transaction, *, item_kind: str, item_key: str, reason: str, error_type: str | None
) -> ParkedItem:
    """Record one failure of an item (one transaction): count it, set its next retry, keep the loop's
    rows within the cap. Returns the row as written."""
    loop = LOOP_OF_KIND[item_kind]
    now = tx.now_ms()
    project_id = repo.project_of(tx, item_kind=item_kind, item_key=item_key)
    failures = repo.park(
        tx,
        loop=loop,
        item_kind=item_kind,
        item_key=item_key,
        project_id=project_id,
        reason=reason,
        error_type=error_type,
        now_ms=now,
    )
    repo.set_retry(
        tx, item_kind=item_kind, item_key=item_key, next_retry_at_ms=now + retry_delay_ms(failures)
    )
    if failures == 1:
        over = repo.count_of_loop(tx, loop) - MAX_PARKED_PER_LOOP
        if over > 0:
            repo.evict_oldest(tx, loop, limit=over)
    found = repo.get(tx, item_kind=item_kind, item_key=item_key)
    assert found is not None  # written just now, and the newest failure is never the evicted one
    return found


class ItemGuard:
    """Runs one loop's items so that one bad item never stops it (module docstring).

    Call ``new_cycle()`` at the start of each cycle; the loop's parked rows are read lazily, once per
    cycle and only when an item comes up, so an idle cycle costs nothing."""

    def __init__(self, db: Database, loop: str) -> None:
        if loop not in LOOPS:
            raise ValidationFailed("unknown loop", field="loop")
        self._db = db
        self.loop = loop
        self._parked: dict[tuple[str, str], int] | None = None
        self._now_ms = 0

    def new_cycle(self) -> None:
        self._parked = None

    def _load(self) -> dict[tuple[str, str], int]:
        if self._parked is None:

            def read(tx: Transaction) -> tuple[int, list[repo.ParkedKey]]:
                return tx.now_ms(), repo.keys_of_loop(tx, self.loop, limit=MAX_PARKED_PER_LOOP)

            self._now_ms, keys = self._db.transaction(read, write=False)
            self._parked = {(k.item_kind, k.item_key): k.next_retry_at_ms for k in keys}
            stale_before = self._now_ms - STALE_AFTER_MS
            if any(due < stale_before for due in self._parked.values()):
                self._db.transaction(lambda tx: repo.drop_stale(tx, self.loop, before_ms=stale_before))
                self._parked = {k: due for k, due in self._parked.items() if due >= stale_before}
        return self._parked

    def skip(self, item_kind: str, item_key: str) -> bool:
        """Whether the item is parked and not yet due for its retry."""
        due = self._load().get((item_kind, item_key))
        return due is not None and due > self._now_ms

    def run(
        self, item_kind: str, item_key: str, handle: Callable[[], T], *, skip_parked: bool = True
    ) -> T | Parked:
        """``handle()``'s result; ``Parked`` when the item is parked (skipped, or parked now). A transient
        error propagates (the cycle fails); any other is recorded and swallowed. ``skip_parked=False``:
        the item's own store decides when it is due again (the notification outbox's backoff)."""
        if LOOP_OF_KIND.get(item_kind) != self.loop:
            raise ValidationFailed("the item kind is not this loop's", field="item_kind")
        if skip_parked and self.skip(item_kind, item_key):
            return Parked(skipped=True)
        try:
            result = handle()
        except Exception as exc:
            if is_transient(exc):
                raise
            self._park(item_kind, item_key, exc)
            return Parked(skipped=False)
        parked = self._load()
        if (item_kind, item_key) in parked:
            self._db.transaction(lambda tx: repo.unpark(tx, item_kind=item_kind, item_key=item_key))
            del parked[(item_kind, item_key)]
            log.info(
                "parked item recovered",
                extra={"action": "loop.item_unparked", "loop": self.loop, "kind": item_kind, "key": item_key},
            )
        return result

    def park_failure(self, item_kind: str, item_key: str, exc: Exception) -> None:
        """Park an item whose handling failed inside a batch the loop committed without it (a
        savepoint undid its part); a transient error is the caller's to raise, never parked."""
        if LOOP_OF_KIND.get(item_kind) != self.loop:
            raise ValidationFailed("the item kind is not this loop's", field="item_kind")
        self._park(item_kind, item_key, exc)

    def recovered(self, item_kind: str, item_key: str) -> None:
        """An item handled inside a committed batch: un-park it if it was parked."""
        parked = self._load()
        if (item_kind, item_key) in parked:
            self._db.transaction(lambda tx: repo.unpark(tx, item_kind=item_kind, item_key=item_key))
            del parked[(item_kind, item_key)]
            log.info(
                "parked item recovered",
                extra={"action": "loop.item_unparked", "loop": self.loop, "kind": item_kind, "key": item_key},
            )

    def _park(self, item_kind: str, item_key: str, exc: Exception) -> None:
        reason, error_type = reason_of(exc)
        row = self._db.transaction(
            lambda tx: park(tx, item_kind=item_kind, item_key=item_key, reason=reason, error_type=error_type)
        )
        self._load()[(item_kind, item_key)] = row.next_retry_at_ms
        log.warning(
            "item parked",
            extra={
                "action": "loop.item_parked",
                "loop": self.loop,
                "kind": item_kind,
                "key": item_key,
                "code": reason,
                "error_type": error_type,
                "failures": row.failures,
            },
        )


def guarded(guard: ItemGuard | None, item_kind: str, item_key: str, handle: Callable[[], T]) -> T | Parked:
    """``guard.run(...)``, or just ``handle()`` for a caller without a guard (a test driving one part)."""
    return handle() if guard is None else guard.run(item_kind, item_key, handle)


# -- read models and the retry-now action -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedPage:
    items: list[ParkedItem]
    truncated: bool


def item_view(item: ParkedItem) -> dict[str, Any]:
    """Ids, codes and times only (no message, no command)."""
    return {
        "loop": item.loop,
        "item_kind": item.item_kind,
        "item_key": item.item_key,
        "project_id": item.project_id,
        "reason": item.reason,
        "error_type": item.error_type,
        "failures": item.failures,
        "first_failed_at_ms": item.first_failed_at_ms,
        "last_failed_at_ms": item.last_failed_at_ms,
        "next_retry_at_ms": item.next_retry_at_ms,
    }


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise ValidationFailed("limit out of range", field="limit")
    return limit


def list_project(tx: Transaction, project: Project, *, limit: int = MAX_LIST) -> ParkedPage:
    """A project's parked items, the most recent failure first."""
    found = repo.list_project(tx, project.id, limit=_limit(limit) + 1)
    return ParkedPage(items=found[:limit], truncated=len(found) > limit)


def list_all(tx: Transaction, *, limit: int = MAX_LIST) -> ParkedPage:
    """Every parked item of the server (items with no project included), for the owner."""
    found = repo.list_all(tx, limit=_limit(limit) + 1)
    return ParkedPage(items=found[:limit], truncated=len(found) > limit)


def retry_now(tx: Transaction, *, item_kind: str, item_key: str, project: Project | None) -> ParkedItem:
    """Make a parked item due at once (its loop retries it on its next cycle). ``project`` None: the
    owner's server-wide scope; else the item must belong to that project."""
    if item_kind not in LOOP_OF_KIND or not 1 <= len(item_key) <= 128:
        raise NotFound("parked item not found")
    found = repo.get(tx, item_kind=item_kind, item_key=item_key)
    if found is None or (project is not None and found.project_id != project.id):
        raise NotFound("parked item not found")
    repo.retry_now(tx, item_kind=item_kind, item_key=item_key, now_ms=tx.now_ms())
    tx.notify(_LOOP_CHANNEL[found.loop])
    after = repo.get(tx, item_kind=item_kind, item_key=item_key)
    assert after is not None
    return after


def counts(tx: Transaction) -> dict[tuple[str, str], int]:
    """Parked items by (loop, reason), for ``/metrics``."""
    return repo.counts_by_loop_and_reason(tx)
