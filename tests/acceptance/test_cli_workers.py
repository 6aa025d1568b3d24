"""``ql3 worker list`` and ``ql3 worker drain`` against a real server with its embedded worker."""

from __future__ import annotations

import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow


def test_worker_list_shows_the_embedded_worker_online(shared_server: Server) -> None:
    page = shared_server.cli_json("worker", "list")
    human = shared_server.cli("worker", "list")

    embedded = [w for w in page["items"] if w["id"].startswith("embedded-")]
    assert len(embedded) == 1
    worker = embedded[0]
    assert worker["status"] == "online"
    assert worker["executors"] == ["local_process"]
    assert worker["max_concurrent_runs"] >= 1
    assert not any("session" in key for key in worker)
    assert human.returncode == 0
    assert worker["id"] in human.stdout and "online" in human.stdout


def test_a_viewer_sees_workers_but_cannot_drain_them(shared_server: Server) -> None:
    viewer = shared_server.cli_json("token", "create", "--role", "viewer", "--name", "watcher")["token"]
    env = {"QL3_URL": shared_server.url, "QL3_TOKEN": viewer}
    worker_id = shared_server.cli_json("worker", "list")["items"][0]["id"]

    listed = shared_server.cli("worker", "list", "--json", env=env)
    drained = shared_server.cli("worker", "drain", worker_id, env=env)

    assert listed.returncode == 0
    assert drained.returncode == 1
    assert drained.stderr.startswith("error: permission_denied:")
    assert shared_server.cli_json("worker", "list")["items"][0]["status"] == "online"


def test_the_owner_drains_the_embedded_worker_and_new_runs_wait(serve: Server) -> None:
    # Given a server whose embedded worker is draining
    worker_id = serve.cli_json("worker", "list")["items"][0]["id"]
    drained = serve.cli_json("worker", "drain", worker_id)
    serve.cli_json("task", "add", "held", "--command", "true")

    # When a run is started and waited for a little while
    done = serve.cli("run", "start", "held", "--wait", "--timeout-wait", "1.5", "--json")

    # Then the worker shows draining and the run was not given to it
    assert (drained["id"], drained["status"]) == (worker_id, "draining")
    assert serve.cli_json("worker", "list")["items"][0]["status"] == "draining"
    assert done.returncode == 5
    run = serve.cli_json("run", "list", "--task", "held")["items"][0]
    assert run["status"] == "queued"


def test_draining_an_unknown_worker_fails(shared_server: Server) -> None:
    done = shared_server.cli("worker", "drain", "no-such-worker")

    assert done.returncode == 1
    assert done.stderr.startswith("error: not_found:")
