"""Nothing of an attempt stays in the worker's receipts directory once the attempt is settled, without a
restart (issue 34 item 5): the receipt of a process stopped after a lease loss is sent (stop cause
``fence``: the run is not failed by the exit code the stop caused), a KILL past the grace leaves no
launch identity, and a receipt the control plane refuses goes too (the journal row is the evidence)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ql3.application import tasks, workers
from ql3.domain.ids import new_id
from ql3.domain.workers import parse_capabilities
from ql3.execution.identity import ProcessHandle
from ql3.worker.agent import WorkerAgent
from tests.support.waits import wait_for
from tests.support.worker_agent import Env

pytestmark = pytest.mark.slow


def _running(
    world: Env, command: str, tmp_path: Path, *, grace_ms: int = 1_000
) -> tuple[WorkerAgent, str, str]:
    """An agent running ``command`` (which touches ``ready`` first); returns it, the offer and attempt ids."""
    ready = tmp_path / "ready"
    world.task = world.db.transaction(
        lambda tx: tasks.edit_task(
            tx, world.project.id, "t", {"command": f"echo up > {ready}; {command}", "grace_ms": grace_ms}
        )
    ).task
    agent = world.agent()
    agent.start()
    offer = world.queue_and_claim(agent)
    assert agent.receive(offer) == "started"
    wait_for(ready.exists, what="the command to start")
    return agent, offer.offer_id, offer.fence.attempt_id


def _replace_the_session(world: Env, agent: WorkerAgent) -> None:
    """Another session of w1 registers: every lease the agent holds is fenced; maintenance stops them."""
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not reaped yet) has exited
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _files(agent: WorkerAgent) -> list[str]:
    return sorted(name for name in os.listdir(agent.config.receipts_dir) if not name.startswith("."))


def _attempt(world: Env, attempt_id: str) -> dict[str, object]:
    rows = world.db.raw("SELECT status, error_code, exit_code FROM run_attempts WHERE id = ?", (attempt_id,))
    return dict(rows[0])


def test_the_receipt_of_a_process_stopped_after_a_lease_loss_is_sent_at_once(
    env: Env, tmp_path: Path
) -> None:
    # Given a running command that ends on TERM (the shim publishes its receipt, exit 143)
    agent, offer_id, attempt_id = _running(env, "exec sleep 30", tmp_path)
    try:
        assert len(_files(agent)) == 2  # the reserved receipt and the launch identity

        # When its session is replaced and the worker stops it
        _replace_the_session(env, agent)

        # Then the receipt is sent and deleted with the launch identity, without a restart
        wait_for(
            lambda: _files(agent) == [], what="the receipts directory to empty", detail=lambda: _files(agent)
        )
        # As a stop for the lease (fence), never a failure of the command: the attempt is lost
        attempt = _attempt(env, attempt_id)
        assert attempt["status"] == "lost" and attempt["error_code"] == "LEASE_FENCED", attempt
        assert attempt["exit_code"] == 143
        assert agent.journal.get(offer_id) is None  # the control plane holds the fact: nothing to recover
    finally:
        agent.stop()


def test_a_kill_past_the_grace_leaves_no_launch_identity(env: Env, tmp_path: Path) -> None:
    # Given a command that ignores TERM, so the stop needs KILL after its 0.5 s grace (no receipt)
    agent, offer_id, _ = _running(env, "trap '' TERM; exec sleep 30", tmp_path, grace_ms=500)
    try:
        _replace_the_session(env, agent)

        wait_for(
            lambda: _files(agent) == [], what="the receipts directory to empty", detail=lambda: _files(agent)
        )
        record = agent.journal.get(offer_id)
        assert record is not None and record.recovery_reason == "lease_lost_local_execution_stopped"
    finally:
        agent.stop()


def test_a_process_killed_outside_the_worker_leaves_nothing(env: Env, tmp_path: Path) -> None:
    # Given a running command whose whole group is killed by someone else (no receipt)
    agent, _, attempt_id = _running(env, "exec sleep 30", tmp_path)
    try:
        with agent._attempts.lock:
            pid = agent._attempts.by_attempt[attempt_id].pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # the shim leads its group

        # Then the exit watcher reports it lost and removes the reservation and the launch identity
        wait_for(
            lambda: _files(agent) == [], what="the receipts directory to empty", detail=lambda: _files(agent)
        )
        assert _attempt(env, attempt_id)["status"] == "lost"
    finally:
        agent.stop()


def test_a_refused_receipt_is_not_kept_and_the_slot_is_freed(env: Env, tmp_path: Path) -> None:
    # Given a running command that ends when told to
    go = tmp_path / "go"
    agent, offer_id, attempt_id = _running(env, f"while [ ! -e {go} ]; do sleep 0.02; done", tmp_path)
    try:
        # When the control plane will refuse its receipt (another callback token digest is on record)
        env.db.raw("UPDATE run_attempts SET callback_token_hash = ? WHERE id = ?", ("0" * 64, attempt_id))
        go.touch()

        # Then the receipt goes, the attempt leaves the active set, the journal keeps why
        wait_for(
            lambda: _files(agent) == [], what="the receipts directory to empty", detail=lambda: _files(agent)
        )
        wait_for(lambda: agent.active_count == 0, what="the slot to be freed")
        record = agent.journal.get(offer_id)
        assert record is not None and record.state == "recovery_required"
        assert record.recovery_reason == "completion_refused"
    finally:
        agent.stop()


def test_a_receipt_sent_before_the_running_ack_is_on_record_is_kept_and_settled_later(
    env: Env, tmp_path: Path
) -> None:
    # Given a running command whose running ACK the control plane does not hold yet (as while its
    # commit is still on its way)
    go = tmp_path / "go"
    agent, offer_id, attempt_id = _running(env, f"while [ ! -e {go} ]; do sleep 0.02; done", tmp_path)
    try:
        held = env.db.raw("SELECT callback_token_hash FROM run_attempts WHERE id = ?", (attempt_id,))
        env.db.raw("UPDATE run_attempts SET callback_token_hash = NULL WHERE id = ?", (attempt_id,))

        # When the command ends and its receipt is sent (answered running_ack_missing)
        record = agent.journal.get(offer_id)
        assert record is not None and record.executor_handle is not None
        leader = ProcessHandle.decode(record.executor_handle).pid
        go.touch()
        wait_for(lambda: not _alive(leader), what="the command's group leader to exit")
        agent.maintain()

        # Then the receipt and the attempt stay (not a refusal), and once the ACK is on record the next
        # maintenance pass settles the run with the command's own exit code
        assert agent.active_count == 1 and _files(agent) != []
        record = agent.journal.get(offer_id)
        assert record is not None and record.recovery_reason != "completion_refused"
        env.db.raw(
            "UPDATE run_attempts SET callback_token_hash = ? WHERE id = ?",
            (held[0]["callback_token_hash"], attempt_id),
        )
        wait_for(lambda: (agent.maintain(), agent.active_count == 0)[1], what="the attempt to settle")
        run_id = env.db.raw("SELECT run_id FROM run_attempts WHERE id = ?", (attempt_id,))[0]["run_id"]
        assert env.run_status(run_id) == "succeeded"
        assert _files(agent) == []
    finally:
        agent.stop()
