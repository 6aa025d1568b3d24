"""Identity is re-proven before the KILL too, not only before the TERM (issue 8 item 6).

Two cases that only the pidfd proof gets right:
- a group whose leader is replaced between TERM and KILL: the old group is gone and a new session
  leader holds the same pid and group number (forced inside a private PID namespace);
- a genuine handle of a process that is not its group's leader.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.execution.controller import ProcessController
from ql3.execution.identity import ProcessHandle, capture, probe
from tests.support.processes import signal_pending

PROBE = Path(__file__).with_name("replaced_group_probe.py")


def _namespaces_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    done = subprocess.run([unshare, "-Urpf", "--mount-proc", "true"], capture_output=True, check=False)
    return done.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces_available(), reason="needs unprivileged user + PID namespaces (unshare -Urpf)"
)


def _probe(moment: str, mode: str) -> dict[str, object]:
    unshare = shutil.which("unshare")
    assert unshare is not None
    done = subprocess.run(
        [unshare, "-Urpf", "--mount-proc", sys.executable, str(PROBE), moment, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    # The scenario really happened: a new session leader holds the old leader's pid and group number.
    assert result["new"] == result["old"] == result["new_pgrp"]
    return result


@needs_namespaces
@pytest.mark.parametrize("mode", ["pidfd", "killpg"])
def test_a_leader_replaced_after_the_last_check_gets_no_kill(mode: str) -> None:
    # Given a TERM-ignoring group whose leader is replaced (same pid, same group number) after the
    # controller's last liveness check and before its KILL
    # When the controller stops it
    result = _probe("before_kill", mode)

    # Then the KILL is refused on the pidfd's proof, and the new group is untouched
    assert (result["status"], result["term"], result["kill"]) == ("termination_requested", True, False)
    assert result["replacement_alive"] is True


@needs_namespaces
@pytest.mark.parametrize("mode", ["pidfd", "killpg"])
def test_the_grace_ends_as_soon_as_the_pinned_group_is_gone_even_if_its_number_is_reused(mode: str) -> None:
    # Given a group whose leader is replaced during the grace by a new leader with the same numbers
    # When the controller stops it with a 60 s grace
    result = _probe("during_grace", mode)

    # Then the liveness check proves the old group gone through the pidfd and ends the stop at the first
    # re-check (a number-based check alone would take the new group for ours and wait the whole grace),
    # and the new group got no signal
    assert (result["status"], result["term"], result["kill"]) == ("termination_requested", True, False)
    assert result["replacement_alive"] is True
    assert result["grace_waited_s"] == pytest.approx(0.05)


# TERM is blocked, so a TERM sent by mistake stays visible as pending instead of being handled.
_FAMILY = (
    "import os, signal, sys, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})\n"
    "child = os.fork()\n"
    "if child == 0:\n"
    "    time.sleep(600)\n"
    "    os._exit(0)\n"
    "print(child, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def member_of_another_group() -> Iterator[tuple[int, ProcessHandle]]:
    """A group leader (own session) and the genuine handle of its child, a member that does not lead."""
    proc = subprocess.Popen([sys.executable, "-c", _FAMILY], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        yield proc.pid, capture(child, "att-member")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("group_signal_via_pidfd", [None, False])
def test_a_genuine_handle_of_a_non_leader_sends_nothing(
    member_of_another_group: tuple[int, ProcessHandle], group_signal_via_pidfd: bool | None
) -> None:
    leader, handle = member_of_another_group
    # Given a handle captured from a live process that is a member, not the leader, of its group
    assert handle.pgid == leader != handle.pid

    # When it is stopped
    outcome = ProcessController(group_signal_via_pidfd=group_signal_via_pidfd).stop(
        handle.encode(), handle.pid, grace_ms=0
    )

    # Then it is refused as not ours to signal, and no member of that group got anything
    assert outcome.status == "identity_mismatch"
    assert (outcome.term_signal_sent, outcome.kill_signal_sent) == (False, False)
    for pid in (leader, handle.pid):
        assert not signal_pending(pid, signal.SIGTERM)
    assert probe(handle) == "running"
