"""Waiting for a condition a real process or thread will bring about: the suite's one wait helper.

Never a timing assertion: the deadline only bounds how long a broken test hangs, so it is generous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

T = TypeVar("T")

DEADLINE_S = 30.0
# The first polls come quickly (a process state that changes within milliseconds is seen at once);
# the pause then doubles up to the cap, so a long wait on a CLI or HTTP round trip stays cheap.
FIRST_PAUSE_S = 0.005
MAX_PAUSE_S = 0.1


def wait_for(
    predicate: Callable[[], T | Literal[False] | None],
    timeout_s: float = DEADLINE_S,
    *,
    what: str = "the condition",
    detail: Callable[[], object] | None = None,
) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value; fail the test with
    ``what`` in the message when ``timeout_s`` passes first. (A predicate written ``cond and value``
    returns ``False`` or the value: the type returned is the value's.) ``detail``, when given, is
    called on failure and its text appended to the message (the last state seen, for diagnosis)."""
    deadline = time.monotonic() + timeout_s
    pause = FIRST_PAUSE_S
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            extra = "" if detail is None else f"; {detail()}"
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{extra}")
        time.sleep(min(pause, left))
        pause = min(pause * 2, MAX_PAUSE_S)


def wait_for_lock_waiter(db: Any, *, what: str) -> None:
    """Wait until some session of ``db``'s PostgreSQL database waits on a row or table lock: the
    second connection of a two-connection race has reached the lock the first one holds."""

    def waiting() -> bool:
        rows = db.raw(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        )
        return int(rows[0]["n"]) >= 1

    wait_for(waiting, 20.0, what=what)
