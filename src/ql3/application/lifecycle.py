"""LifecycleRunner: one cycle at a time, the next scheduled only after the previous ends, woken by a
notifier with a slow backstop. Every exception, whether raised by the cycle or by the call that decides
how long to sleep, goes to a bounded diagnostics ring and a bounded backoff: it never ends the loop."""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import Ql3Error, ValidationFailed

log = logging.getLogger("ql3.lifecycle")
MAX_DIAGNOSTICS: Final = 32
# Backoff after a failure: FIRST * 2**(n-1), capped by MAX and by the loop's own backstop, with jitter.
BACKOFF_FIRST_S: Final = 0.05
BACKOFF_MAX_S: Final = 5.0
# A loop is stuck when its last successful cycle is older than this many backstops (and at least
# STUCK_MIN_S): a healthy idle loop runs one cycle per backstop at the latest.
STUCK_BACKSTOPS: Final = 3
STUCK_MIN_S: Final = 60.0
_MAX_ERROR_TYPE: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    at_monotonic: float
    loop: str
    code: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopHealth:
    """What ``/readyz`` and ``/metrics`` report for one loop. No ids, no messages."""

    name: str
    running: bool
    age_s: float
    consecutive_failures: int
    stuck_after_s: float

    @property
    def stuck(self) -> bool:
        return self.running and self.age_s > self.stuck_after_s


def failure_fields(exc: BaseException) -> tuple[str, str]:
    """A stable error code and the exception's type name, both bounded; never the message, which may
    carry data (a DSN, a command, a value)."""
    code = exc.code if isinstance(exc, Ql3Error) else "internal_error"
    return code[:_MAX_ERROR_TYPE], type(exc).__name__[:_MAX_ERROR_TYPE]


class LifecycleRunner:
    """Runs ``cycle()`` repeatedly in one named thread.

    ``cycle`` returns True when it did work (run again at once, up to ``burst`` times) and False when
    idle (then wait for ``wake`` or the backstop). ``wake`` blocks until a notification or the timeout.
    A failure of either is logged once and followed by a backoff, then the next cycle.
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
        stuck_after_s: float | None = None,
        on_drained: Callable[[], None] | None = None,
    ) -> None:
        if not 0.01 <= backstop_s <= 3600 or not 1 <= burst <= 10_000 or not 0 < drain_timeout_s <= 600:
            raise ValidationFailed("invalid lifecycle cadence", loop=name)
        if stuck_after_s is None:
            stuck_after_s = max(STUCK_MIN_S, STUCK_BACKSTOPS * backstop_s)
        if not backstop_s < stuck_after_s <= 86_400:
            raise ValidationFailed("the stuck bound must exceed the backstop", loop=name)
        self.name = name
        self._cycle = cycle
        self._wake = wake
        self._backstop_s = backstop_s
        self._burst = burst
        self._drain_timeout_s = drain_timeout_s
        self._interrupt = interrupt
        self._stuck_after_s = stuck_after_s
        self._on_drained = on_drained
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.diagnostics: collections.deque[Diagnostic] = collections.deque(maxlen=MAX_DIAGNOSTICS)
        self.cycles = 0
        self.failures = 0
        self._consecutive_failures = 0
        self._last_success = time.monotonic()

    @property
    def backstop_s(self) -> float:
        """How long the loop sleeps when idle and nothing wakes it."""
        return self._backstop_s

    def start(self) -> None:
        """Start the loop thread. Refused while a previous thread is alive: a cycle that outlived
        ``stop()``'s bounded drain blocks a restart until it ends (it never reschedules itself)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the previous loop is still running")
        self._stop.clear()
        self._last_success = time.monotonic()  # the age counts from the start, not from construction
        self._consecutive_failures = 0
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
        if self._on_drained is not None:
            try:
                self._on_drained()
            except Exception as exc:  # e.g. the database already closed: logged, the stop goes on
                log.warning(
                    "loop drain hook failed",
                    extra={
                        "action": "lifecycle.drain_hook_failed",
                        "loop": self.name,
                        "error": type(exc).__name__,
                    },
                )
        return True

    def health(self, now_monotonic: float | None = None) -> LoopHealth:
        """The age of the last successful cycle. A started loop whose thread has ended is reported
        with an infinite age, so it counts as stuck."""
        now = time.monotonic() if now_monotonic is None else now_monotonic
        thread = self._thread
        running = thread is not None and not self._stop.is_set()
        alive = thread is not None and thread.is_alive()
        age = max(0.0, now - self._last_success) if alive or not running else float("inf")
        return LoopHealth(
            name=self.name,
            running=running,
            age_s=age,
            consecutive_failures=self._consecutive_failures,
            stuck_after_s=self._stuck_after_s,
        )

    def _record_failure(self, exc: Exception, stage: str) -> None:
        code, error_type = failure_fields(exc)
        self.failures += 1
        self._consecutive_failures += 1
        self.diagnostics.append(
            Diagnostic(at_monotonic=time.monotonic(), loop=self.name, code=code, error=error_type)
        )
        log.warning(
            "cycle failed",
            extra={
                "action": "lifecycle.cycle_failed",
                "loop": self.name,
                "stage": stage,
                "code": code,
                "error_type": error_type,
                "consecutive": self._consecutive_failures,
            },
        )

    def _backoff(self) -> None:
        """Sleep after a failure, bounded; ``stop()`` ends the sleep at once."""
        n = min(self._consecutive_failures, 30)
        delay = min(BACKOFF_MAX_S, self._backstop_s, BACKOFF_FIRST_S * 2 ** (n - 1))
        self._stop.wait(delay * (0.5 + random.random() / 2))

    def _run_cycle(self) -> bool | None:
        """True: did work; False: idle; None: failed."""
        try:
            self.cycles += 1
            did_work = self._cycle()
        except Exception as exc:  # a failing cycle is recorded, never fatal to the loop
            self._record_failure(exc, "cycle")
            return None
        self._last_success = time.monotonic()
        self._consecutive_failures = 0
        return did_work

    def _loop(self) -> None:
        while not self._stop.is_set():
            outcome: bool | None = False
            for _ in range(self._burst):
                if self._stop.is_set():
                    break
                outcome = self._run_cycle()
                if not outcome:
                    break
            if self._stop.is_set():
                break
            if outcome is None:
                self._backoff()
                continue
            if outcome:
                continue  # a whole burst of productive cycles: there may be more work now
            # The last cycle made no progress: wait, even after a burst of productive ones (a
            # scan that ends unproductive must not start over at once, or it spins).
            try:
                self._wake(self._backstop_s)
            except Exception as exc:  # e.g. the database went away while deciding how long to sleep
                self._record_failure(exc, "wait")
                self._backoff()
