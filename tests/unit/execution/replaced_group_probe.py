"""Run as PID 1 of a fresh user + PID namespace (``unshare -Urpf --mount-proc``): stop a group whose
leader is replaced, under the same pid and group number, between the TERM and the KILL.

Inside its own namespace the probe may set ``ns_last_pid``, so it can force the kernel to hand the
old leader's pid to a new session leader at an exact point of ``ProcessController.stop``: the fake
clock below calls ``replace`` there. It prints one JSON line with what happened.

Usage: ``replaced_group_probe.py before_kill|during_grace pidfd|killpg``
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable

from ql3.execution import controller as controller_module
from ql3.execution.controller import ProcessController
from ql3.execution.identity import capture


def _spawn(argv: list[str]) -> int:
    return os.posix_spawn(argv[0], argv, dict(os.environ), setsid=True)


def _reap_everything_but(keep: int) -> None:
    # As PID 1 of the namespace we inherit every orphan; a zombie would keep the group number taken.
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0 or pid == keep:
            return


class FakeTime:
    """The controller's clock: ``sleep`` advances it; the hook fires once, at the chosen call."""

    def __init__(self, hook_on: str, hook: Callable[[], None]) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.monotonic_calls = 0
        self._hook_on = hook_on
        self._hook: Callable[[], None] | None = hook

    def _fire(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()

    def monotonic(self) -> float:
        self.monotonic_calls += 1
        # Call 1 sets the deadline right after TERM; call 2 is the last one before the KILL when the
        # grace is zero: the replacement lands after the last liveness check, before the KILL.
        if self._hook_on == "before_kill" and self.monotonic_calls == 2:
            self._fire()
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self._hook_on == "during_grace":
            self._fire()
        self.now += seconds


def main() -> None:
    moment, mode = sys.argv[1], sys.argv[2]
    assert os.getpid() == 1, "run me as PID 1 of a new PID namespace"
    # The old group's only member ignores TERM, so it is alive at every check until we end it.
    old = _spawn(["/bin/sh", "-c", "trap '' TERM; exec sleep 600"])
    while True:
        with open(f"/proc/{old}/stat", "rb") as f:
            if b"(sleep)" in f.read():
                break
    handle = capture(old, "att-replaced")
    replacement: dict[str, int] = {}

    def replace() -> None:
        os.kill(old, signal.SIGKILL)
        os.waitpid(old, 0)
        _reap_everything_but(-1)
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(old - 1))
        new = _spawn(["/bin/sleep", "600"])
        replacement["pid"] = new
        with open(f"/proc/{new}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        replacement["pgrp"] = int(fields[2])

    fake = FakeTime(moment, replace)
    controller_module.time = fake  # type: ignore[attr-defined,assignment]
    controller = ProcessController(group_signal_via_pidfd=(mode == "pidfd"))
    grace_ms = 0 if moment == "before_kill" else 60_000
    outcome = controller.stop(handle.encode(), old, grace_ms=grace_ms, poll_ms=50)
    new = replacement["pid"]
    alive = os.waitpid(new, os.WNOHANG) == (0, 0)
    print(
        json.dumps(
            {
                "old": old,
                "new": new,
                "new_pgrp": replacement["pgrp"],
                "status": outcome.status,
                "term": outcome.term_signal_sent,
                "kill": outcome.kill_signal_sent,
                "replacement_alive": alive,
                "grace_waited_s": fake.now,
            }
        ),
        flush=True,
    )
    os.kill(new, signal.SIGKILL)


if __name__ == "__main__":
    main()
