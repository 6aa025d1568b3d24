"""Feedback while waiting and following: why a run is still queued, what Ctrl-C leaves running,
status colours on a terminal only, labelled local times."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.support.server import (
    CLI,
    Server,
    base_env,
    gated_command,
    read_until,
    spawn_cli,
    start_server,
    stop,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[Server]:
    server = start_server(tmp_path / "home", "--slots", "1")
    try:
        yield server
    finally:
        stop(server.process)


def test_wait_says_the_run_is_still_queued_while_the_only_slot_is_busy(
    one_slot: Server, tmp_path: Path
) -> None:
    # Given the only slot held by a run that waits for a gate
    gate = tmp_path / "gate"
    one_slot.cli_json("task", "add", "holder", "--command", gated_command(gate))
    one_slot.cli_json("task", "add", "waiter", "--command", "echo waited")
    holder = spawn_cli("run", "start", "holder", "--follow", home=one_slot.home)
    read_until(holder, "one")

    # When another run is started with --wait
    waiter = spawn_cli("run", "start", "waiter", "--wait", home=one_slot.home)
    assert waiter.stderr is not None
    seen = b""
    deadline = time.monotonic() + 60
    while b"still queued" not in seen and time.monotonic() < deadline:
        chunk = os.read(waiter.stderr.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    gate.touch()

    # Then it said why it was waiting, and still ended with the run's outcome
    assert b"still queued: " in seen, seen
    assert waiter.wait(timeout=60) == 0 and holder.wait(timeout=60) == 0
    stop(waiter)
    stop(holder)


def test_ctrl_c_on_follow_says_the_run_goes_on_and_how_to_cancel_it(serve: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    serve.cli_json("task", "add", "long", "--command", gated_command(gate))
    follower = spawn_cli("run", "start", "long", "--follow", home=serve.home)
    read_until(follower, "one")

    follower.send_signal(signal.SIGINT)
    code = follower.wait(timeout=30)
    assert follower.stderr is not None
    err = follower.stderr.read().decode()
    runs = serve.cli_json("run", "list", "--task", "long")["items"]
    gate.touch()

    assert code == 130
    assert "goes on on the server" in err and "Traceback" not in err
    short = runs[0]["id"][:13]
    assert f"ql3 run cancel {short}" in err and f"ql3 run logs {short} --follow" in err
    assert runs[0]["status"] in ("running", "succeeded")
    stop(follower)


def _on_a_terminal(server: Server, *args: str, env: dict[str, str] | None = None) -> str:
    """Run the CLI with stdout on a pseudo-terminal and return what it printed there."""
    parent, child = pty.openpty()
    try:
        done = subprocess.run(
            [*CLI, *args],
            env={**base_env(server.home), "TERM": "xterm", **(env or {})},
            stdout=child,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
        os.close(child)
        child = -1
        assert done.returncode == 0, done.stderr
        out = b""
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # EIO once the terminal is drained and closed
                break
            if not chunk:
                break
            out += chunk
        return out.decode(errors="replace")
    finally:
        if child != -1:
            os.close(child)
        os.close(parent)


def test_statuses_are_coloured_on_a_terminal_but_not_with_no_color_or_piped(serve: Server) -> None:
    serve.cli_json("task", "add", "bad", "--command", "exit 3")
    assert serve.cli("run", "start", "bad", "--wait").returncode == 2  # failed

    coloured = _on_a_terminal(serve, "run", "list")
    plain = _on_a_terminal(serve, "run", "list", env={"NO_COLOR": "1"})
    piped = serve.cli("run", "list").stdout

    assert "\x1b[31mfailed\x1b[0m" in coloured
    assert "\x1b[" not in plain and "failed" in plain
    assert "\x1b[" not in piped and "failed" in piped


def test_times_are_local_and_labelled_and_utc_on_request(serve: Server) -> None:
    serve.cli_json("task", "add", "timed", "--command", "true", "--timeout", "600")
    run = serve.cli_json("run", "start", "timed", "--wait")
    shanghai = {"TZ": "Asia/Shanghai"}

    local = serve.cli("run", "show", run["id"], env=shanghai).stdout
    utc = serve.cli("--utc", "run", "show", run["id"], env=shanghai).stdout
    listed = serve.cli("run", "list", "--utc", env=shanghai).stdout
    task = serve.cli("task", "show", "timed").stdout

    created = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in local.splitlines()}["created"]
    assert created.endswith(" CST")
    created_utc = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in utc.splitlines()}["created"]
    assert created_utc.endswith(" UTC")
    shown = datetime.strptime(created[:19], "%Y-%m-%d %H:%M:%S")
    shown_utc = datetime.strptime(created_utc[:19], "%Y-%m-%d %H:%M:%S")
    assert shown - shown_utc == timedelta(hours=8)  # Asia/Shanghai is UTC+8 all year
    assert "CREATED (UTC)" in listed.splitlines()[0]
    # No raw epoch milliseconds (13 digits on their own; ids are hex in groups of at most 12)
    assert "_ms" not in local + task and re.search(r"\b\d{13}\b", local + task) is None
    assert "timeout         10m" in task
