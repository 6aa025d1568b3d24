"""The dispatch loop of ``ql3 serve`` (application/embedded_dispatch.py): which notifications end its
wait after each kind of cycle, so that a run wakes it once and not three times, and no wake it needs
is lost. ``wait(0)`` only looks (no sleeping, no timing)."""

from __future__ import annotations

from collections.abc import Callable

from ql3.application.dispatcher import DispatchResult
from ql3.application.embedded_dispatch import EmbeddedDispatch
from ql3.domain.offers import Offer
from ql3.ports import channels
from ql3.storage.notify import LocalNotifier

SLOTS = 2


class _World:
    def __init__(self, *results: DispatchResult, during: Callable[[], None] | None = None) -> None:
        self.notifier = LocalNotifier()
        self.results = list(results)
        self.active = 0
        self.submitted: list[Offer] = []
        self.faults: list[str] = []
        self.dispatches = 0
        self.asked: list[int] = []
        self._during = during
        self.loop = EmbeddedDispatch(
            self._dispatch_once,
            active_count=lambda: self.active,
            slots=SLOTS,
            submit=self._submit,
            wakeups=self.notifier,
            fault=self.faults.append,
        )

    def _submit(self, offer: Offer, *, asked_at: float | None = None) -> None:
        assert asked_at is not None  # every offer of a cycle is fresh: stamped before its claim
        self.submitted.append(offer)

    def _dispatch_once(self, max_offers: int) -> DispatchResult:
        self.dispatches += 1
        self.asked.append(max_offers)
        if self._during is not None:
            self._during()
        return self.results.pop(0)

    def runs_notified(self) -> int:
        return self.notifier.counters((channels.RUNS,))[channels.RUNS]


def _idle(reason: str) -> DispatchResult:
    return DispatchResult(reason=reason)


def test_after_a_scan_that_found_no_queued_run_only_a_new_run_ends_the_wait() -> None:
    world = _World(_idle("no_candidates"))
    assert world.loop.cycle() is False

    # A freed slot (a lease's end, or the worker's) has nothing to place
    world.notifier.notify(channels.SLOTS)
    world.loop.on_settled("a1")
    assert world.loop.wait(0) is False
    assert world.runs_notified() == 0

    # A new run does
    world.notifier.notify(channels.RUNS)
    assert world.loop.wait(0) is True


def test_while_queued_runs_wait_for_a_slot_a_freed_slot_ends_the_wait() -> None:
    for reason in ("no_capacity", "no_match", "claim_raced", "no_workers"):
        world = _World(_idle(reason))
        assert world.loop.cycle() is False
        assert world.loop.wait(0) is False

        world.notifier.notify(channels.SLOTS)

        assert world.loop.wait(0) is True, reason


def test_a_full_active_set_is_woken_once_by_an_attempt_leaving_it() -> None:
    # Given a worker whose active set is full: the cycle does not even look at the queue
    world = _World()
    world.active = SLOTS
    assert world.loop.cycle() is False
    assert world.dispatches == 0

    # The lease's commit comes while the set is still full: it cannot help, and does not wake the loop
    world.notifier.notify(channels.SLOTS)
    assert world.loop.wait(0) is False

    # When the attempt leaves the set, the worker wakes the loop, once
    world.active = SLOTS - 1
    world.loop.on_settled("a1")
    assert world.runs_notified() == 1
    assert world.loop.wait(0) is True
    world.loop.on_settled("a2")
    assert world.runs_notified() == 1


def test_a_freed_slot_wakes_nobody_when_the_set_was_not_full() -> None:
    world = _World(_idle("no_capacity"))
    world.active = SLOTS - 1
    assert world.loop.cycle() is False

    world.loop.on_settled("a1")

    assert world.runs_notified() == 0


def test_a_cycle_that_finds_the_set_free_again_is_no_longer_waiting_for_a_slot() -> None:
    world = _World(_idle("no_candidates"))
    world.active = SLOTS
    assert world.loop.cycle() is False
    world.active = 0
    assert world.loop.cycle() is False  # a new run woke it and it looked: the queue was empty

    world.loop.on_settled("a1")

    assert world.runs_notified() == 0


def test_a_notification_while_the_cycle_looks_ends_the_next_wait_at_once() -> None:
    # A run committed while the cycle was reading the (still empty) queue
    world = _World(_idle("no_candidates"), during=lambda: world.notifier.notify(channels.RUNS))
    assert world.loop.cycle() is False

    assert world.loop.wait(0) is True


def test_an_offer_goes_to_the_worker_and_the_loop_looks_again_at_once() -> None:
    offer = object.__new__(Offer)
    world = _World(
        DispatchResult(reason="claimed", offers=(offer,), truncated=True),
        DispatchResult(reason="x", truncated=True),
    )

    assert world.loop.cycle() is True
    assert world.submitted == [offer] and world.faults == ["after_claim"]
    # A scan cut by its budget is progress too: the loop continues without waiting
    assert world.loop.cycle() is True
    assert world.submitted == [offer]


def test_a_cycle_asks_for_no_more_offers_than_the_active_set_has_free_slots() -> None:
    world = _World(_idle("no_candidates"))
    world.active = SLOTS - 1

    world.loop.cycle()

    assert world.asked == [1]


def test_a_cycle_that_offered_every_queued_run_waits_without_an_empty_cycle() -> None:
    # Given a cycle that started at the head, reached the end of the queue and claimed all it saw
    offers = (object.__new__(Offer), object.__new__(Offer))
    world = _World(DispatchResult(reason="claimed", offers=offers, drained=True))

    # Then every offer goes to the worker and the loop waits instead of looking again at once
    assert world.loop.cycle() is False
    assert world.submitted == list(offers) and world.faults == ["after_claim"]
    assert world.dispatches == 1

    # A freed slot has nothing to place; a new run ends the wait
    world.notifier.notify(channels.SLOTS)
    assert world.loop.wait(0) is False
    world.notifier.notify(channels.RUNS)
    assert world.loop.wait(0) is True


def test_a_run_created_while_an_offering_cycle_looked_ends_its_wait_at_once() -> None:
    # A run committed while the cycle was claiming the ones it had read: no wake-up is lost
    offer = object.__new__(Offer)
    world = _World(
        DispatchResult(reason="claimed", offers=(offer,), drained=True),
        during=lambda: world.notifier.notify(channels.RUNS),
    )
    assert world.loop.cycle() is False

    assert world.loop.wait(0) is True


def test_a_cycle_that_offered_some_runs_and_left_others_queued_also_waits_for_a_freed_slot() -> None:
    offer = object.__new__(Offer)
    world = _World(DispatchResult(reason="claimed", offers=(offer,)))
    assert world.loop.cycle() is False

    world.notifier.notify(channels.SLOTS)

    assert world.loop.wait(0) is True
