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
        key = f"__seen__{channel}"
        with self._cond:
            seen = self._counters.get(key, 0)
            ok = self._cond.wait_for(lambda: self._counters.get(channel, 0) > seen, timeout_s)
            self._counters[key] = self._counters.get(channel, 0)
            return ok
