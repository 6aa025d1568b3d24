"""``ql3 run logs`` against a real server: the whole output after the run, and ``--follow`` on a run
that is still going."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.server import CLI_TIMEOUT_S, Server, gated_command, read_until, spawn_cli, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _wait_for_log(server: Server, run_id: str, text: str, timeout_s: float = 30.0) -> None:
    def logged() -> bool:
        done = server.cli("run", "logs", run_id)
        return done.returncode == 0 and text in done.stdout

    wait_for(logged, timeout_s, what=f"{text!r} in the log of {run_id}")


def test_run_logs_prints_the_output_after_completion(shared_server: Server) -> None:
    # Given a finished run that wrote to stdout and stderr
    shared_server.cli_json(
        "task", "add", "chatty", "--command", "echo alpha; echo beta >&2; printf 'gamma\\n'"
    )
    run = shared_server.cli_json("run", "start", "chatty", "--wait")
    assert run["status"] == "succeeded"

    # When its log is printed, as text and as JSON
    done = shared_server.cli("run", "logs", run["id"])
    as_json = shared_server.cli_json("run", "logs", run["id"])

    # Then all of it is there, in order, and the JSON says it is complete
    assert done.returncode == 0, done.stderr
    assert done.stdout == "alpha\nbeta\ngamma\n"
    assert (as_json["data"], as_json["attempt"], as_json["complete"]) == ("alpha\nbeta\ngamma\n", 1, True)


def test_run_logs_reads_a_log_larger_than_one_page(shared_server: Server) -> None:
    # Given a run that printed 600,000 bytes (three pages of 256 KiB)
    shared_server.cli_json("task", "add", "big", "--command", "head -c 600000 /dev/zero | tr '\\0' x")
    run = shared_server.cli_json("run", "start", "big", "--wait")

    done = shared_server.cli("run", "logs", run["id"])

    assert done.returncode == 0, done.stderr
    assert done.stdout == "x" * 600_000


def test_run_logs_follow_returns_after_the_run_ends_with_every_line(
    shared_server: Server, tmp_path: Path
) -> None:
    # Given a running run that has printed "one" and waits for a gate before "two"
    gate = tmp_path / "gate"
    shared_server.cli_json("task", "add", "gated-logs", "--command", gated_command(gate))
    run = shared_server.cli_json("run", "start", "gated-logs")
    _wait_for_log(shared_server, run["id"], "one\n")

    # When its log is followed
    follower = spawn_cli("run", "logs", run["id"], "--follow", home=shared_server.home)
    try:
        # Then the follower prints "one" and keeps going while the run runs
        read_until(follower, "one\n")
        time.sleep(0.3)
        assert follower.poll() is None

        # And when the run ends it prints the rest and exits 0
        gate.touch()
        out, err = follower.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        stop(follower)
    assert follower.returncode == 0, err
    assert out == b"two\n"
    assert shared_server.cli_json("run", "show", run["id"])["status"] == "succeeded"


def test_run_logs_without_follow_stops_at_the_current_end(shared_server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    shared_server.cli_json("task", "add", "gated-snapshot", "--command", gated_command(gate))
    run = shared_server.cli_json("run", "start", "gated-snapshot")
    try:
        _wait_for_log(shared_server, run["id"], "one\n")

        done = shared_server.cli("run", "logs", run["id"])

        assert (done.returncode, done.stdout) == (0, "one\n")
    finally:
        gate.touch()


def test_run_logs_of_an_unknown_run_fails(shared_server: Server) -> None:
    done = shared_server.cli("run", "logs", "01a22d6c-0942-71ad-b0a5-4738104dd590")

    assert done.returncode == 1
    assert done.stderr.startswith("error: not_found:")


def test_a_viewer_token_can_read_logs(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "viewed", "--command", "echo seen")
    run = shared_server.cli_json("run", "start", "viewed", "--wait")
    viewer = shared_server.cli_json("token", "create", "--role", "viewer", "--name", "log-reader")["token"]

    done = shared_server.cli(
        "run", "logs", run["id"], env={"QL3_URL": shared_server.url, "QL3_TOKEN": viewer}
    )

    assert (done.returncode, done.stdout) == (0, "seen\n")
