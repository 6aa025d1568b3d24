"""Waiting for a condition a real process or thread will bring about: poll with a generous deadline.

These are never timing assertions: the deadline only bounds how long a broken test hangs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

DEADLINE_S = 15.0


def wait_for(predicate: Any, timeout_s: float = 30.0) -> Any:
    """Poll every 100 ms until ``predicate()`` is truthy and return that value; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def wait_until(predicate: Callable[[], object], timeout_s: float = DEADLINE_S) -> bool:
    """Poll a condition until it holds or a generous deadline passes; never a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def poll_until(predicate: Any, timeout_s: float = DEADLINE_S) -> None:
    """Poll every 20 ms until ``predicate()`` holds; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")
