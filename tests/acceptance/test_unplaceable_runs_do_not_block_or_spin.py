"""A real ``ql3 serve``: runs no worker can take, queued ahead of a plain run, neither block it nor
keep the dispatcher loop busy once it has looked at them all."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow

UNPLACEABLE = 40  # well over one cycle's scan budget (2 pages of 8)


def _dispatcher_cycles(server: Server) -> int:
    body = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(r'^ql3_loop_cycles_total\{loop="dispatcher"\} ([0-9.e+]+)$', body, re.M)
    assert found is not None, body
    return int(float(found.group(1)))


def test_unplaceable_runs_neither_block_a_plain_run_nor_spin_the_dispatcher(serve: Server) -> None:
    # Given 40 queued runs that need gpu=yes on a server whose worker has no labels
    added = serve.cli("task", "add", "gpu", "--command", "true", "--require", "gpu=yes")
    assert added.returncode == 0 and "warning" in added.stderr
    token = serve.credentials()["token"]
    with httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        for _ in range(UNPLACEABLE):
            assert api.post("/api/v1/projects/default/tasks/gpu/runs", json={}).status_code == 201

    # When a plain run is started behind them
    serve.cli_json("task", "add", "plain", "--command", "true")
    done = serve.cli_json("run", "start", "plain", "--wait", "--timeout-wait", "60")

    # Then it succeeds, and the idle dispatcher loop stops cycling (no busy loop over the backlog)
    assert done["status"] == "succeeded"
    deadline = time.monotonic() + 30
    while True:
        before = _dispatcher_cycles(serve)
        time.sleep(1.0)
        after = _dispatcher_cycles(serve)
        if after - before <= 2:  # at most a wake-up or a backstop: a spinning loop does thousands
            break
        assert time.monotonic() < deadline, f"the dispatcher keeps cycling: {after - before} per second"
    queued = serve.cli_json("run", "list", "--task", "gpu")["items"]
    assert {r["status"] for r in queued} == {"queued"}
    assert {r["waiting_reason"] for r in queued} == {"no_matching_worker"}
