"""A lease-loss stop honours the task's grace (issue 8 item 5): TERM, the task's grace, then KILL."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql3.application import tasks, workers
from ql3.domain.ids import new_id
from ql3.domain.workers import parse_capabilities
from tests.support.waits import wait_for
from tests.support.worker_agent import Env

HANDLER_S = 6  # longer than the old fixed 5 s grace


def _lose_the_lease_while_running(world: Env, grace_ms: int, tmp_path: Path) -> tuple[Path, str]:
    ready, marker = tmp_path / "ready", tmp_path / "marker"
    command = (
        f"trap 'sleep {HANDLER_S}; echo done > {marker}; exit 0' TERM; "
        f"echo up > {ready}; while :; do sleep 1; done"
    )
    world.task = world.db.transaction(
        lambda tx: tasks.edit_task(tx, world.project.id, "t", {"command": command, "grace_ms": grace_ms})
    ).task
    agent = world.agent()
    agent.start()
    try:
        offer = world.queue_and_claim(agent)
        assert agent.receive(offer) == "started"
        wait_for(ready.exists)
        # Another session replaces ours: every lease we hold is fenced, so the worker stops its process.
        world.db.transaction(
            lambda tx: workers.register(
                tx,
                worker_id="w1",
                session_id=new_id(),
                capabilities=parse_capabilities({"executors": ["local_process"]}),
                max_concurrent_runs=4,
                session_lease_ms=30_000,
            )
        )
        agent._maintenance.last_renewal_ms = 0
        agent.maintain()
        record = agent.journal.get(offer.offer_id)
        assert record is not None
        return marker, str(record.recovery_reason)
    finally:
        agent.stop()


@pytest.mark.slow
def test_a_lease_loss_stop_waits_the_tasks_longer_grace(env: Env, tmp_path: Path) -> None:
    # Given a running task whose TERM handler needs 6 s, with an 8 s grace
    # When the worker loses its lease and stops the process
    marker, reason = _lose_the_lease_while_running(env, 8_000, tmp_path)

    # Then the handler finished before any KILL
    assert reason == "lease_lost_local_execution_stopped"
    assert marker.read_text().strip() == "done"


@pytest.mark.slow
def test_a_lease_loss_stop_kills_after_a_one_second_grace(env: Env, tmp_path: Path) -> None:
    # Given the same task with a 1 s grace
    # When the worker loses its lease and stops the process
    marker, reason = _lose_the_lease_while_running(env, 1_000, tmp_path)

    # Then the KILL cut the handler short (the stop returns only once the group is gone)
    assert reason == "lease_lost_local_execution_stopped"
    assert not marker.exists()
