"""In-process wake-ups for loops: set after a commit, waited on with a backstop timeout.

A notification wakes only the threads waiting on its channel: every waiter has its own condition
(all of them share one lock), registered under each channel it waits on. One condition for every
channel would wake every loop of the server on every commit, each to find its predicate still false
and sleep again: about twenty thread hand-offs per run (bench/README.md, "Worker side")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from threading import Condition, Lock


class LocalNotifier:
    def __init__(self) -> None:
        self._lock = Lock()
        self._counters: dict[str, int] = {}
        self._seen: dict[str, int] = {}  # per channel: the count the last wait()/wait_any() consumed
        self._waiters: dict[str, set[Condition]] = {}

    def notify(self, channel: str) -> None:
        with self._lock:
            self._counters[channel] = self._counters.get(channel, 0) + 1
            for waiter in self._waiters.get(channel, ()):
                waiter.notify()

    def wait(self, channel: str, timeout_s: float) -> bool:
        """Wait for a notification on ``channel`` that arrives after this call started... or one
        that arrived since the previous wait on it, so a wake-up between two waits is never lost."""
        return self.wait_any((channel,), timeout_s)

    def wait_any(self, channels: tuple[str, ...], timeout_s: float) -> bool:
        """``wait`` over several channels: True as soon as any of them was notified."""
        with self._lock:
            seen = {c: self._seen.get(c, 0) for c in channels}
            ok = self._wait_locked(
                channels, lambda: any(self._counters.get(c, 0) > seen[c] for c in channels), timeout_s
            )
            for c in channels:
                self._seen[c] = self._counters.get(c, 0)
            return ok

    def counters(self, channels: tuple[str, ...]) -> dict[str, int]:
        """How many notifications each channel has had: a waiter's own mark for ``wait_past``."""
        with self._lock:
            return {c: self._counters.get(c, 0) for c in channels}

    def waiting(self, channel: str) -> int:
        """How many threads wait on ``channel`` right now (tests use it to know a long-poll waits)."""
        with self._lock:
            return len(self._waiters.get(channel, ()))

    def wait_past(self, marks: dict[str, int], timeout_s: float) -> bool:
        """Wait until a channel in ``marks`` was notified past its mark (taken with ``counters``
        before the caller last looked at the database), so no wake-up in between is lost, whatever
        other waiters on the same channels do."""
        with self._lock:
            return self._wait_locked(
                marks, lambda: any(self._counters.get(c, 0) > n for c, n in marks.items()), timeout_s
            )

    def _wait_locked(self, channels: Iterable[str], predicate: Callable[[], bool], timeout_s: float) -> bool:
        """With ``_lock`` held: wait for ``predicate`` on a condition of this waiter's own, registered
        under ``channels`` for the time of the wait."""
        if predicate():
            return True
        waiter = Condition(self._lock)
        names = tuple(channels)
        for c in names:
            self._waiters.setdefault(c, set()).add(waiter)
        try:
            return waiter.wait_for(predicate, timeout_s)
        finally:
            for c in names:
                registered = self._waiters.get(c)
                if registered is not None:
                    registered.discard(waiter)
                    if not registered:
                        del self._waiters[c]
