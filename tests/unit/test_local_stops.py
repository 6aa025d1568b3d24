"""A stop through lease control (worker/stops.py) whose process's leader is already gone still KILLs
what survived of the attempt in its group (by identity: ``sweep_orphans``): a child that ignores
TERM, left behind by a shell that died a moment before the stop."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ql3.domain.offers import LeaseFence
from ql3.worker.attempts import ActiveAttempt, ActiveAttempts
from ql3.worker.stops import LocalStops

HANDLE = "ql3lp1.handle-of-the-attempt"


class FakeController:
    def __init__(self, status: str) -> None:
        self.status = status
        self.swept: list[str] = []
        self.done = threading.Event()

    def stop(self, handle_text: str, expected_pid: int | None, *, grace_ms: int = 0) -> Any:
        return SimpleNamespace(status=self.status, term_signal_sent=False, kill_signal_sent=False)

    def sweep_orphans(self, handle_text: str) -> int:
        self.swept.append(handle_text)
        return 1


def _stops(controller: FakeController) -> LocalStops:
    fence = LeaseFence(
        run_id="r1",
        attempt_id="a1",
        worker_id="w1",
        session_id="s1",
        worker_generation=1,
        lease_generation=1,
        lease_token="t",
        lease_version=1,
    )
    attempts = ActiveAttempts()
    attempts.put("a1", ActiveAttempt(offer_id="o1", fence=fence, handle=HANDLE, pid=4242))
    record = SimpleNamespace(attempt_id="a1", executor_handle=HANDLE, offer_json="{}")
    journal = SimpleNamespace(find_by_attempt=lambda attempt_id: record)
    client = SimpleNamespace(lease_control=lambda fence: "stop_requested")
    stops = LocalStops(
        client=client,
        controller=controller,
        attempts=attempts,
        journal=lambda: journal,
    )
    return stops


def _wait_for_stop_thread() -> None:
    deadline = time.monotonic() + 10
    while any(t.name == "ql3-stop" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize(("status", "swept"), [("already_exited", [HANDLE]), ("termination_requested", [])])
def test_a_stop_that_finds_the_leader_gone_sweeps_the_survivors(status: str, swept: list[str]) -> None:
    controller = FakeController(status)
    assert _stops(controller).control_stop("a1") == "stop_requested"
    _wait_for_stop_thread()
    assert controller.swept == swept
