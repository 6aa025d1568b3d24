"""A worker restarted with other slots or labels registers a new session with them (issue 34 item 1),
instead of exiting on "the session was registered with different content": the old session is fenced
(its process is stopped at the start, its receipt settled); the same content resumes the same session."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ql3.application import tasks
from ql3.application.gateway import InProcessControlPlane
from ql3.worker.agent import WorkerAgent
from ql3.worker.config import WorkerConfig
from tests.support.waits import wait_for
from tests.support.worker_agent import Env

pytestmark = pytest.mark.slow


def _agent(env: Env, *, slots: int, labels: dict[str, str] | None = None) -> WorkerAgent:
    return WorkerAgent(
        InProcessControlPlane(env.db),
        WorkerConfig(worker_id="w1", home=env.home / "worker", slots=slots, labels=labels or {}),
        clock=lambda: time.time_ns() // 1_000_000,
    )


def _registry(env: Env) -> dict[str, object]:
    row = env.db.raw("SELECT session_id, generation, max_concurrent_runs, capabilities_json FROM workers")[0]
    return dict(row)


def test_the_same_content_resumes_and_other_content_registers_a_new_session(env: Env) -> None:
    first = _agent(env, slots=4)
    first.start()
    first.stop()
    resumed = _agent(env, slots=4)
    resumed.start()
    resumed.stop()
    assert _registry(env)["generation"] == 1  # the same session, resumed

    # When the worker starts again with more slots and a label
    bigger = _agent(env, slots=8, labels={"zone": "b"})
    bigger.start()
    try:
        # Then a new session holds them: a new generation, the new content
        registry = _registry(env)
        assert registry["generation"] == 2 and registry["max_concurrent_runs"] == 8
        assert json.loads(str(registry["capabilities_json"]))["labels"] == {"zone": "b"}
        assert bigger.session is not None and bigger.session.session_id == registry["session_id"]
    finally:
        bigger.stop()


def test_a_session_file_of_an_older_version_is_replaced_when_the_content_changed(env: Env) -> None:
    first = _agent(env, slots=4)
    first.start()
    first.stop()
    # Given a session.json without the content (written before it was kept)
    path = env.home / "worker" / "session.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({"worker_id": data["worker_id"], "session_id": data["session_id"]}))

    # When the worker starts with other slots, the control plane's conflict is its cue
    other = _agent(env, slots=2)
    other.start()
    try:
        assert _registry(env)["generation"] == 2 and _registry(env)["max_concurrent_runs"] == 2
    finally:
        other.stop()


def test_a_process_of_the_old_session_is_stopped_and_settled_at_the_restart(env: Env, tmp_path: Path) -> None:
    # Given a running command of a worker with 4 slots, and the worker stopped (the command outlives it)
    ready = tmp_path / "ready"
    env.task = env.db.transaction(
        lambda tx: tasks.edit_task(
            tx, env.project.id, "t", {"command": f"echo up > {ready}; exec sleep 30", "grace_ms": 1000}
        )
    ).task
    old = _agent(env, slots=4)
    old.start()
    offer = env.queue_and_claim(old)
    assert old.receive(offer) == "started"
    wait_for(ready.exists, what="the command to start")
    old.stop()

    # When it starts again with 8 slots
    new = _agent(env, slots=8)
    new.start()
    try:
        # Then the old session's process was stopped, its receipt sent (stop cause fence: the attempt is
        # lost, its run retried or failed by its lost-retry policy) and nothing is left in its home
        receipts = new.config.receipts_dir
        wait_for(
            lambda: os.listdir(receipts) == [],
            what="the receipts to settle",
            detail=lambda: os.listdir(receipts),
        )
        attempt = env.db.raw(
            "SELECT status, error_code FROM run_attempts WHERE id = ?", (offer.fence.attempt_id,)
        )
        assert dict(attempt[0]) == {"status": "lost", "error_code": "LEASE_FENCED"}
        assert new.active_count == 0
    finally:
        new.stop()
