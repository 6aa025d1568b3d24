"""In-process wake-ups for loops: set after a commit, waited on with a backstop timeout."""

from __future__ import annotations

import threading


class LocalNotifier:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counters: dict[str, int] = {}

    def notify(self, channel: str) -> None:
        with self._cond:
            self._counters[channel] = self._counters.get(channel, 0) + 1
            self._cond.notify_all()

    def wait(self, channel: str, timeout_s: float) -> bool:
        """Wait for a notification on ``channel`` that arrives after this call started... or one
        that arrived since the previous wait on it, so a wake-up between two waits is never lost."""
        return self.wait_any((channel,), timeout_s)

    def wait_any(self, channels: tuple[str, ...], timeout_s: float) -> bool:
        """``wait`` over several channels: True as soon as any of them was notified."""
        with self._cond:
            seen = {c: self._counters.get(f"__seen__{c}", 0) for c in channels}
            ok = self._cond.wait_for(
                lambda: any(self._counters.get(c, 0) > seen[c] for c in channels), timeout_s
            )
            for c in channels:
                self._counters[f"__seen__{c}"] = self._counters.get(c, 0)
            return ok

    def counters(self, channels: tuple[str, ...]) -> dict[str, int]:
        """How many notifications each channel has had: a waiter's own mark for ``wait_past``."""
        with self._cond:
            return {c: self._counters.get(c, 0) for c in channels}

    def wait_past(self, marks: dict[str, int], timeout_s: float) -> bool:
        """Wait until a channel in ``marks`` was notified past its mark (taken with ``counters``
        before the caller last looked at the database), so no wake-up in between is lost, whatever
        other waiters on the same channels do."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(self._counters.get(c, 0) > n for c, n in marks.items()), timeout_s
            )
