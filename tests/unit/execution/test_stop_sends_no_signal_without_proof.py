"""Without a verified identity, stop sends zero signals and leaves the process alone."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ql3.execution import controller as controller_module
from ql3.execution.controller import MAX_GRACE_MS, MAX_POLL_MS, ProcessController, StopOutcome
from ql3.execution.identity import ProcessHandle, capture, probe
from tests.support.processes import signal_pending

# TERM is blocked, so a TERM sent by mistake stays visible as pending instead of being handled.
TARGET = (
    "import signal, sys, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def _start_target(*, own_group: bool) -> Iterator[ProcessHandle]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET], stdout=subprocess.PIPE, start_new_session=own_group
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield capture(proc.pid, "att-target")
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def target() -> Iterator[ProcessHandle]:
    """A live process-group leader that blocks TERM, and its genuine handle."""
    yield from _start_target(own_group=True)


@pytest.fixture
def non_leader() -> Iterator[ProcessHandle]:
    """A live process that blocks TERM and sits in this test process's group."""
    yield from _start_target(own_group=False)


def _untouched(handle: ProcessHandle, outcome: StopOutcome) -> bool:
    return (
        outcome.term_signal_sent is False
        and outcome.kill_signal_sent is False
        and not signal_pending(handle.pid, signal.SIGTERM)
        and probe(handle) == "running"
    )


def test_a_handle_older_than_the_live_process_means_pid_reuse_and_sends_nothing(
    target: ProcessHandle,
) -> None:
    # Given a handle whose process started before the live process now holding that pid
    tampered = dataclasses.replace(target, start_ticks=str(int(target.start_ticks) - 1))

    # When it is stopped
    outcome = ProcessController().stop(tampered.encode(), target.pid, grace_ms=0)

    # Then the handle's process is proven gone (its pid was reused) and the live process got no signal
    assert outcome.status == "already_exited"
    assert _untouched(target, outcome)


def test_a_handle_newer_than_the_live_process_is_a_mismatch_and_sends_nothing(target: ProcessHandle) -> None:
    # Given a handle claiming a later start than the live process at that pid has: impossible if genuine
    tampered = dataclasses.replace(target, start_ticks=str(int(target.start_ticks) + 1))

    # When it is stopped
    outcome = ProcessController().stop(tampered.encode(), target.pid, grace_ms=0)

    # Then nothing proves an exit: mismatch, and no signal
    assert outcome.status == "identity_mismatch"
    assert _untouched(target, outcome)


def test_tampered_boot_id_sends_nothing(target: ProcessHandle) -> None:
    tampered = dataclasses.replace(target, boot_id="00000000-0000-0000-0000-000000000000")

    outcome = ProcessController().stop(tampered.encode(), target.pid, grace_ms=0)

    assert outcome.status == "already_exited"
    assert _untouched(target, outcome)


def test_same_start_but_another_group_is_a_mismatch_not_an_exit(non_leader: ProcessHandle) -> None:
    # Given a handle that claims the live process leads its own group, which it does not
    assert non_leader.pgid != non_leader.pid
    tampered = dataclasses.replace(non_leader, pgid=non_leader.pid)

    # When it is stopped
    outcome = ProcessController().stop(tampered.encode(), non_leader.pid, grace_ms=0)

    # Then it is the same process (same start), so not exited, but not ours to signal either
    assert outcome.status == "identity_mismatch"
    assert _untouched(non_leader, outcome)


def test_expected_pid_mismatch_sends_nothing(target: ProcessHandle) -> None:
    outcome = ProcessController().stop(target.encode(), target.pid + 1, grace_ms=0)

    assert outcome.status == "pid_mismatch"
    assert _untouched(target, outcome)


def test_a_handle_whose_group_is_not_its_pid_sends_nothing(target: ProcessHandle) -> None:
    tampered = dataclasses.replace(target, pgid=target.pid + 1)

    outcome = ProcessController().stop(tampered.encode(), None, grace_ms=0)

    assert outcome.status == "identity_mismatch"
    assert _untouched(target, outcome)


@pytest.mark.parametrize("text", ["", "ql3lp1.", "ql3lp1.!!!", "pid:1234"])
def test_invalid_handle_text_is_invalid(text: str) -> None:
    assert ProcessController().stop(text, None) == StopOutcome(
        status="invalid", term_signal_sent=False, kill_signal_sent=False
    )


def test_without_pidfds_the_platform_is_unsupported(
    target: ProcessHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller_module, "pidfds_supported", lambda: False)

    outcome = ProcessController().stop(target.encode(), target.pid)

    assert outcome.status == "unsupported"
    assert _untouched(target, outcome)


@pytest.mark.parametrize(
    ("grace_ms", "poll_ms"), [(-1, 50), (300_001, 50), (5000, 0), (5000, 1001), (True, 50)]
)
def test_stop_arguments_are_validated(grace_ms: int, poll_ms: int) -> None:
    with pytest.raises(ValueError):
        ProcessController().stop("ql3lp1.x", None, grace_ms=grace_ms, poll_ms=poll_ms)


@pytest.mark.parametrize(
    ("grace_ms", "poll_ms", "message"),
    [(-1, 50, "grace_ms"), (300_001, 50, "grace_ms"), (5000, 0, "poll_ms"), (5000, 1001, "poll_ms")],
)
def test_an_argument_out_of_range_is_named(grace_ms: int, poll_ms: int, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{message} out of range$"):
        ProcessController().stop("ql3lp1.x", None, grace_ms=grace_ms, poll_ms=poll_ms)


@pytest.mark.parametrize(("grace_ms", "poll_ms"), [(0, 1), (MAX_GRACE_MS, MAX_POLL_MS)])
def test_the_bounds_of_grace_and_poll_are_accepted(grace_ms: int, poll_ms: int) -> None:
    # The arguments pass validation; the text is then refused as a handle, before any signal
    outcome = ProcessController().stop("pid:1234", None, grace_ms=grace_ms, poll_ms=poll_ms)

    assert outcome.status == "invalid"


def test_pidfds_are_unsupported_off_linux_or_without_either_call(monkeypatch: pytest.MonkeyPatch) -> None:
    assert controller_module.pidfds_supported() is True  # this machine: Linux with both calls
    with monkeypatch.context() as m:
        m.setattr(sys, "platform", "darwin")
        assert controller_module.pidfds_supported() is False
    with monkeypatch.context() as m:
        m.delattr(os, "pidfd_open")
        assert controller_module.pidfds_supported() is False
    with monkeypatch.context() as m:
        m.delattr(signal, "pidfd_send_signal")
        assert controller_module.pidfds_supported() is False
