"""What the agent knows of the attempts it executes: the in-memory active set (bounded by the slots)
and the offer as the journal stores it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from ql3.domain.cancellation import DEFAULT_GRACE_MS
from ql3.domain.errors import Ql3Error
from ql3.domain.journal import JournalRecord
from ql3.domain.offers import JournaledOffer, LeaseFence, Offer

CALLBACK_SEQUENCE: Final = 1

# What the journal keeps of a spec is a ``JournalSpec`` (domain/execution.py): identity and stop
# policy. The command, working directory and environment values reach the launcher from the delivered
# offer only, and never touch the disk here.


@dataclass(slots=True)
class ActiveAttempt:
    """In-memory view of one attempt this worker is executing (bounded by the slots)."""

    offer_id: str
    fence: LeaseFence
    handle: str | None = None
    pid: int | None = None
    adopted: bool = False
    stop_requested: bool = False
    # The lease is lost and LocalStops is stopping the process: that path records the outcome in the
    # journal, so the exit it causes is not settled (nor reported lost) beside it.
    lease_lost: bool = False
    acked: bool = False  # running ACK committed: completion may be submitted
    ack_pending: bool = False  # the running ACK failed transiently: maintain() sends it again
    exited: bool = False  # the process exited; completion pending or to be retried
    # The spawn time, while the journal could not take `started` (a full disk): maintain() writes it,
    # then sends the running ACK (``ack_pending`` is set too).
    started_pending: int | None = None
    renewed_at_ms: int | None = None  # the worker clock at the last successful renewal
    # The local fence deadline on the host clock (domain/time_model.py): from the starting ACK's
    # answer, then from each renewal's; the host executor stops the process when it passes.
    fence_at_host_ms: int | None = None


class ActiveAttempts:
    """The active set, keyed by attempt id, behind one re-entrant lock that every part of the agent
    takes before reading or changing an entry. ``forget`` tells ``on_settled`` that a slot is free."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.by_attempt: dict[str, ActiveAttempt] = {}
        self.on_settled: Callable[[str], None] = lambda attempt_id: None

    def get(self, attempt_id: str) -> ActiveAttempt | None:
        with self.lock:
            return self.by_attempt.get(attempt_id)

    def put(self, attempt_id: str, active: ActiveAttempt) -> None:
        with self.lock:
            self.by_attempt[attempt_id] = active

    def snapshot(self, limit: int) -> list[tuple[str, ActiveAttempt]]:
        with self.lock:
            return list(self.by_attempt.items())[:limit]

    def for_record(self, record: JournalRecord) -> ActiveAttempt:
        """The entry of ``record``'s attempt, made from the stored offer when there is none."""
        with self.lock:
            active = self.by_attempt.get(record.attempt_id)
            if active is None:
                offer = journal_offer(record)
                active = ActiveAttempt(
                    offer_id=record.offer_id, fence=offer.fence, handle=record.executor_handle
                )
                self.by_attempt[record.attempt_id] = active
            return active

    def discard(self, attempt_id: str) -> None:
        """Drop an entry without reporting a freed slot (the attempt never held one here)."""
        with self.lock:
            self.by_attempt.pop(attempt_id, None)

    def forget(self, attempt_id: str) -> None:
        with self.lock:
            self.by_attempt.pop(attempt_id, None)
        self.on_settled(attempt_id)

    def has_adopted(self) -> bool:
        with self.lock:
            return any(a.adopted for a in self.by_attempt.values())

    def __len__(self) -> int:
        with self.lock:
            return len(self.by_attempt)


def journal_offer_json(offer: Offer) -> str:
    # The lease token travels beside it (``JournalOffer.lease_token``): the journal keeps it sealed.
    return offer.journaled().to_json()


def journal_offer(record: JournalRecord) -> JournaledOffer:
    """The stored offer with its lease token unsealed by the journal. Reads this build's journal and
    the previous build's (the same ``offer_json`` layout)."""
    offer = JournaledOffer.from_json(json.loads(record.offer_json))
    return replace(offer, fence=replace(offer.fence, lease_token=record.lease_token or ""))


def termination_grace_ms(record: JournalRecord) -> int:
    """The task's TERM -> KILL grace, as the offer carried it (``terminationGraceMs``); the default
    when the stored offer cannot be read."""
    try:
        return JournaledOffer.from_json(json.loads(record.offer_json)).spec.termination_grace_ms
    except (ValueError, KeyError, TypeError, AttributeError, Ql3Error):
        return DEFAULT_GRACE_MS
