"""``ql3 run cancel`` and ``ql3 run status`` against a real ``ql3 serve``: the whole process group of a
run stops, including a child that ignores SIGTERM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.processes import pid_state_and_group, processes_of_run
from tests.support.server import Server
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

# The script's main shell starts a child that ignores SIGTERM, then sleeps itself.
STUBBORN = "sh -c 'trap \"\" TERM; sleep 60' & sleep 60"


def _live_members(pgrp: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            stat = pid_state_and_group(pid)
            if stat is not None and stat[1] == pgrp and stat[0] not in ("Z", "X"):
                out.append(int(pid))
    return out


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_run_cancel_wait_stops_the_whole_process_group(serve: Server) -> None:
    # Given a running run whose script started a child that ignores SIGTERM
    serve.cli_json("task", "add", "stubborn", "--command", STUBBORN)
    run = serve.cli_json("run", "start", "stubborn")
    procs: dict[int, int] = {}

    def three_processes() -> bool:
        procs.update(processes_of_run(run["id"]))
        return len(procs) >= 3  # the main shell, the trapping shell, and the sleeps

    wait_for(three_processes)
    groups = set(procs.values())
    assert len(groups) == 1, procs  # one process group holds the whole script
    (pgrp,) = groups
    assert len(_live_members(pgrp)) >= 3
    assert serve.cli_json("run", "show", run["id"])["status"] == "running"

    # When the run is cancelled and the CLI waits for it
    done = serve.cli("run", "cancel", run["id"], "--wait", "--json")

    # Then the CLI exits 0 with the run cancelled
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["result"] == "requested"
    assert answer["run"]["status"] == "cancelled"
    assert serve.cli_json("run", "show", run["id"])["status"] == "cancelled"
    # And no process of that group is left running when --wait returns, not even the one that
    # ignored SIGTERM: --wait also waits for the stop itself (TERM, grace, KILL) to settle
    assert not _live_members(pgrp)
    assert processes_of_run(run["id"]) == {}

    # And cancelling it again is already_terminal, still exit 0
    again = serve.cli("run", "cancel", run["id"], "--wait", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["result"] == "already_terminal"


def _card(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        out[key] = value.strip()
    return out


def _flat(value: dict[str, object], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out.update(_flat(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(item)
    return out


def test_run_status_on_an_idle_server_is_clear_and_the_card_is_the_json(serve: Server) -> None:
    # When the status is read as JSON and as a card
    as_json = serve.cli("run", "status", "--json")
    as_card = serve.cli("run", "status")

    # Then both exit 0 (clear), and the card shows exactly the JSON's fields and values
    assert as_json.returncode == 0, as_json.stderr
    assert as_card.returncode == 0, as_card.stderr
    status = json.loads(as_json.stdout)
    assert status["schema"] == "qinglong/run-cancellation-status@v1"
    assert status["assessment"] == "clear" and status["operatorAction"] == "none"
    assert status["dispatches"]["total"] == 0
    card, flat = _card(as_card.stdout), _flat(status)
    # instants are labelled times under their names without "Ms" (never epoch milliseconds)
    assert list(card) == [k.removesuffix("Ms") if k.endswith("AtMs") else k for k in flat]
    observed = card.pop("observedAt")  # two requests, two observation times
    assert observed[:4].isdigit() and observed[4] == "-" and not observed.split()[-1].isdigit()
    flat.pop("observedAtMs")
    assert card == {k: v for k, v in flat.items() if not k.endswith("AtMs")} | {
        k.removesuffix("Ms"): "-" for k in flat if k.endswith("AtMs") and k != "observedAtMs"
    }
    assert "\x1b" not in as_card.stdout


def test_run_blocked_with_a_malformed_cursor_is_usage_before_any_request(tmp_path: Path) -> None:
    # Given no server at all (the URL refuses connections)
    from tests.support.server import free_port, run_cli

    env = {"QL3_URL": f"http://127.0.0.1:{free_port()}", "QL3_TOKEN": "ql3_nothing"}

    # When a malformed cursor is given, then it is a usage error (64), not a network error (1)
    bad = run_cli("run", "blocked", "--cursor", "v1.garbage", home=tmp_path / "h", env=env)
    assert bad.returncode == 64, bad.stderr
    assert "invalid_cursor" in bad.stderr
    # ...while a call without a cursor does reach for the network
    unreachable = run_cli("run", "blocked", home=tmp_path / "h", env=env)
    assert unreachable.returncode == 1
