"""The dispatch loop of ``ql3 serve``: one cycle hands its embedded worker at most as many offers as its
active set has free slots, and the loop's wait decides which notifications can wake it
(docs/architecture.md, "Wake-ups").

No empty cycle after an offer: a cycle that started at the head of the queue and reached its end
(the dispatcher's result is not ``truncated``) saw every run queued before its look, and its marks
were taken before that look, so the loop waits; a run created meanwhile has already moved a mark and
ends that wait at once. A cycle cut by a budget or by its batch size runs again at once.

One wake-up per run (issue 11; bench/README.md, "Idle start latency"): a new run notifies ``runs``;
the end of its lease notifies ``slots`` at commit, and the worker frees the slot of its active set a
moment later (``on_settled``). Only one of the three can find work, so the loop listens to what the
last cycle needs:

- after a scan that found no queued run (``no_candidates``), or that claimed every run it saw from
  the head to the end of the queue (``drained``), ``runs`` only: a freed slot has nothing to place,
  and whatever queues a run (creation, a retry, an expired claim) notifies ``runs``;
- after a cycle refused because the worker's active set is full, ``runs`` only as well, and the
  worker's ``on_settled`` notifies ``runs`` (in this process) when one of those attempts leaves the
  set. The lease's ``slots`` commit came before, while the set was still full, and could not help;
- after any other idle cycle (queued runs but no free slot in the database, no matching worker, a
  raced claim), ``runs`` and ``slots``.

The counters are marked before each cycle looks at anything, so a notification that arrives while the
cycle runs ends the following wait at once: nothing is lost between a look and a wait, and a missed
hint still costs at most the backstop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from ql3.application.dispatch_reasons import DispatchReasons
from ql3.application.dispatcher import DispatchResult
from ql3.domain.offers import Offer
from ql3.ports import channels

WAKE_CHANNELS: Final = (channels.RUNS, channels.SLOTS)
log = logging.getLogger("ql3.dispatch")


class Marks(Protocol):
    """The process-local wake-up board (``storage/notify.py``'s ``LocalNotifier``)."""

    def notify(self, channel: str) -> None: ...

    def counters(self, channels: tuple[str, ...]) -> dict[str, int]: ...

    def wait_past(self, marks: dict[str, int], timeout_s: float) -> bool: ...


class Submit(Protocol):
    """The worker's intake: ``asked_at`` is the monotonic time before the claim (a fresh offer)."""

    def __call__(self, offer: Offer, *, asked_at: float | None = None) -> None: ...


class EmbeddedDispatch:
    """``cycle`` and ``wait`` for the dispatcher's ``LifecycleRunner``, ``on_settled`` for the worker."""

    def __init__(
        self,
        dispatch_once: Callable[[int], DispatchResult],
        *,
        active_count: Callable[[], int],
        slots: int,
        submit: Submit,
        wakeups: Marks,
        fault: Callable[[str], None],
        reasons: DispatchReasons | None = None,
    ) -> None:
        """``reasons``: the board that keeps what each cycle said about the runs it could not place
        (application/dispatch_reasons.py); a change of a run's reason is logged once."""
        self._dispatch_once = dispatch_once
        self._reasons = reasons
        self._active_count = active_count
        self._slots = slots
        self._submit = submit
        self._wakeups = wakeups
        self._fault = fault
        self._lock = threading.Lock()
        self._full = False  # the last cycle was refused for a full active set: on_settled wakes it
        self._wait_on = wakeups.counters(WAKE_CHANNELS)

    def cycle(self) -> bool:
        """One dispatch cycle; True when it made progress (an offer, or a scan cut by its budget)."""
        marks = self._wakeups.counters(WAKE_CHANNELS)
        with self._lock:
            # Under the lock that on_settled takes after the attempt left the set: either this sees the
            # slot free, or on_settled sees the flag and wakes the loop.
            free = self._slots - self._active_count()
            self._full = free <= 0
            full = self._full
        if full:
            self._wait_on = {channels.RUNS: marks[channels.RUNS]}
            return False
        # At most the set's free slots (the claims check the worker row's own count as well).
        asked_at = time.monotonic()  # before the claims: their leases were granted after it
        result = self._dispatch_once(free)
        if self._reasons is not None:
            self._note(result, self._reasons)
        empty = result.reason == "no_candidates" or result.drained
        self._wait_on = {channels.RUNS: marks[channels.RUNS]} if empty else marks
        if result.offers:
            self._fault("after_claim")
            for offer in result.offers:
                self._submit(offer, asked_at=asked_at)
        return result.truncated

    @staticmethod
    def _note(result: DispatchResult, reasons: DispatchReasons) -> None:
        """Hand the cycle's reasons to the board; one log line per run whose reason changed."""
        offered = [offer.fence.run_id for offer in result.offers]
        for change in reasons.observe(result.notes, offered):
            log.info(
                "dispatch reason changed",
                extra={
                    "action": "dispatch.reason",
                    "run_id": change.run_id or "-",
                    "scope": "cycle" if change.run_id is None else "run",
                    "reason": change.reason,
                    "previous": change.previous or "-",
                },
            )

    def wait(self, timeout_s: float) -> bool:
        """Until a channel the last cycle needs is notified past its mark, or the timeout."""
        return self._wakeups.wait_past(self._wait_on, timeout_s)

    def on_settled(self, attempt_id: str) -> None:
        """An attempt left the worker's active set: wake the loop if it is waiting for that slot."""
        with self._lock:
            wake, self._full = self._full, False
        if wake:
            self._wakeups.notify(channels.RUNS)
