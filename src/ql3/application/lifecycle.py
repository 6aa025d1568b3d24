"""LifecycleRunner: one cycle at a time, the next scheduled only after the previous ends, woken by a
notifier with a slow backstop; errors go to a bounded diagnostics ring and never kill the loop."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import ValidationFailed

log = logging.getLogger("ql3.lifecycle")
MAX_DIAGNOSTICS: Final = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    at_monotonic: float
    loop: str
    error: str


class LifecycleRunner:
    """Runs ``cycle()`` repeatedly in one named thread.

    ``cycle`` returns True when it did work (run again at once, up to ``burst`` times) and False when
    idle (then wait for ``wake`` or the backstop). ``wake`` blocks until a notification or the timeout.
    """

    def __init__(
        self,
        name: str,
        cycle: Callable[[], bool],
        *,
        wake: Callable[[float], bool],
        backstop_s: float,
        burst: int = 64,
        drain_timeout_s: float = 10.0,
        interrupt: Callable[[], None] | None = None,
    ) -> None:
        if not 0.01 <= backstop_s <= 3600 or not 1 <= burst <= 10_000 or not 0 < drain_timeout_s <= 600:
            raise ValidationFailed("invalid lifecycle cadence", loop=name)
        self.name = name
        self._cycle = cycle
        self._wake = wake
        self._backstop_s = backstop_s
        self._burst = burst
        self._drain_timeout_s = drain_timeout_s
        self._interrupt = interrupt
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.diagnostics: collections.deque[Diagnostic] = collections.deque(maxlen=MAX_DIAGNOSTICS)
        self.cycles = 0

    def start(self) -> None:
        """Start the loop thread. Refused while a previous thread is alive: a cycle that outlived
        ``stop()``'s bounded drain blocks a restart until it ends (it never reschedules itself)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the previous loop is still running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"ql3-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Ask the loop to stop and wait up to the drain timeout; True when it has ended."""
        self._stop.set()
        if self._interrupt is not None:
            self._interrupt()
        thread = self._thread
        if thread is None:
            return True
        thread.join(self._drain_timeout_s)
        if thread.is_alive():
            log.warning(
                "loop did not drain in time",
                extra={"action": "lifecycle.drain_timeout", "loop": self.name},
            )
            return False
        self._thread = None
        return True

    def _run_cycle(self) -> bool:
        try:
            self.cycles += 1
            return self._cycle()
        except Exception as exc:  # a failing cycle is recorded, never fatal to the loop
            self.diagnostics.append(
                Diagnostic(at_monotonic=time.monotonic(), loop=self.name, error=type(exc).__name__)
            )
            log.warning(
                "cycle failed",
                extra={"action": "lifecycle.cycle_failed", "loop": self.name, "error": type(exc).__name__},
            )
            return False

    def _loop(self) -> None:
        while not self._stop.is_set():
            more = False
            for _ in range(self._burst):
                if self._stop.is_set():
                    break
                more = self._run_cycle()
                if not more:
                    break
            if self._stop.is_set():
                break
            if not more:
                # The last cycle made no progress: wait, even after a burst of productive ones (a
                # scan that ends unproductive must not start over at once, or it spins).
                self._wake(self._backstop_s)
