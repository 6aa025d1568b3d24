"""``ql3 run start --wait/--follow`` against a real server: the log streams while it is written, and
the exit status is the run's outcome."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.server import CLI_TIMEOUT_S, Server, gated_command, read_until, run_cli, spawn_cli, stop

pytestmark = pytest.mark.slow


def test_run_start_follow_prints_every_line_and_exits_0(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "two-lines", "--command", "echo one; sleep 1; echo two")

    done = shared_server.cli("run", "start", "two-lines", "--follow")

    assert done.returncode == 0, done.stderr
    assert done.stdout == "one\ntwo\n"
    assert "succeeded" in done.stderr


def test_follow_streams_output_while_the_run_is_still_going(shared_server: Server, tmp_path: Path) -> None:
    # Given a task that prints "one", then waits for a gate before printing "two"
    gate = tmp_path / "gate"
    shared_server.cli_json("task", "add", "gated-follow", "--command", gated_command(gate))

    # When it is started with --follow
    follower = spawn_cli("run", "start", "gated-follow", "--follow", home=shared_server.home)
    try:
        # Then "one" arrives while the run is still going (it cannot end before the gate opens; the
        # command may print before the worker's running ACK commits, so it may still be dispatching)
        read_until(follower, "one\n")
        assert follower.poll() is None
        going = shared_server.cli_json("run", "list", "--task", "gated-follow")["items"][0]
        assert going["status"] in ("dispatching", "running")

        # And once the gate opens, "two" follows and the command exits with the outcome
        gate.touch()
        out, err = follower.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        stop(follower)
    assert follower.returncode == 0, err
    assert out == b"two\n"  # everything after "one\n", which read_until consumed


def test_a_failing_run_exits_2_and_shows_its_exit_code(shared_server: Server) -> None:
    # Given a task whose command exits 3
    shared_server.cli_json("task", "add", "exit-three", "--command", "echo before; exit 3")

    # When it is started with --wait, human and --json
    waited = shared_server.cli("run", "start", "exit-three", "--wait")
    as_json = shared_server.cli("run", "start", "exit-three", "--wait", "--json")

    # Then both exit 2 (failed); --json prints the final run, and run show has exit code 3
    assert waited.returncode == 2, waited.stderr
    assert "failed" in waited.stdout + waited.stderr
    assert as_json.returncode == 2, as_json.stderr
    final = json.loads(as_json.stdout)
    assert (final["status"], final["exit_code"], final["error_code"]) == ("failed", 3, "EXIT_NONZERO")
    shown = shared_server.cli_json("run", "show", final["id"])
    assert (shown["status"], shown["exit_code"]) == ("failed", 3)
    human = shared_server.cli("run", "show", final["id"])
    assert "exit_code" in human.stdout and "EXIT_NONZERO" in human.stdout


def test_a_run_past_its_timeout_exits_3(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "too-slow", "--command", "sleep 30", "--timeout", "0.5")

    done = shared_server.cli("run", "start", "too-slow", "--wait", "--json")

    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["status"] == "timed_out"


def test_follow_with_json_keeps_stdout_one_json_document(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "json-follow", "--command", "echo streamed")

    done = shared_server.cli("run", "start", "json-follow", "--follow", "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "succeeded"
    assert "streamed" in done.stderr


def test_timeout_wait_gives_up_with_exit_5_and_leaves_the_run_going(
    shared_server: Server, tmp_path: Path
) -> None:
    # Given a run that cannot end until its gate opens
    gate = tmp_path / "gate"
    shared_server.cli_json("task", "add", "gated-wait", "--command", gated_command(gate))

    # When the CLI waits for it at most 0.5 s
    started = time.monotonic()
    done = shared_server.cli("run", "start", "gated-wait", "--wait", "--timeout-wait", "0.5")
    took = time.monotonic() - started

    # Then it gives up with exit 5 soon after, and the run is still going
    try:
        assert done.returncode == 5, done.stderr
        assert "wait_timeout" in done.stderr
        assert took < 30  # 0.5 s of waiting plus CLI start-up, with room for a loaded machine
        run = shared_server.cli_json("run", "list", "--task", "gated-wait")["items"][0]
        assert run["status"] in ("queued", "dispatching", "running")
    finally:
        gate.touch()


def test_an_already_finished_idempotent_run_returns_its_outcome_at_once(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "once-failing", "--command", "exit 1")
    first = shared_server.cli("run", "start", "once-failing", "--wait", "--idempotency-key", "k")

    again = shared_server.cli("run", "start", "once-failing", "--wait", "--idempotency-key", "k")

    assert (first.returncode, again.returncode) == (2, 2)


def test_the_outcome_exit_codes_are_documented(tmp_path: Path) -> None:
    top = run_cli("--help", home=tmp_path)
    start = run_cli("run", "start", "--help", home=tmp_path)

    for done in (top, start):
        assert done.returncode == 0
        for text in ("succeeded", "failed", "timed_out", "cancelled", "--timeout-wait"):
            assert text in done.stdout
    assert "--follow" in start.stdout and "--wait" in start.stdout


def test_timeout_wait_without_wait_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cli("run", "start", "x", "--timeout-wait", "1", home=tmp_path)

    assert done.returncode == 64
