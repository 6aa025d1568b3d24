"""The worker agent over a real SQLite control plane and real processes: the crash barrier."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import pytest

from ql3.application import lease_expiry, leases, runs, tasks, workers
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.domain.errors import FenceConflict, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.journal import JournalConflict
from ql3.domain.offers import Offer
from ql3.domain.workers import parse_capabilities
from ql3.execution.identity import ProcessHandle
from ql3.execution.receipts import launch_identity_path, receipt_path
from ql3.ports.control_plane import ControlPlaneUnreachable
from ql3.worker.agent import WorkerAgent
from ql3.worker.intake import FRESH_OFFER_S
from tests.support.waits import wait_for
from tests.support.worker_agent import Crash, Env


def test_a_redelivered_offer_starts_the_command_once(env: Env) -> None:
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)

        first = agent.receive(offer)
        again = agent.receive(offer)

        assert first == "started" and again == "started"
        wait_for(lambda: env.run_status(offer.fence.run_id) == "succeeded")
        assert env.starts() == 1
    finally:
        agent.stop()


def test_the_same_offer_id_with_another_digest_is_refused_before_any_spawn(env: Env) -> None:
    agent = env.agent(fault="after_accept")
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        with pytest.raises(Crash):
            agent.receive(offer)
        tampered_spec = dataclasses.replace(offer.spec, command="echo evil")
        tampered = dataclasses.replace(offer, spec=tampered_spec, spec_digest=tampered_spec.digest())

        with pytest.raises(JournalConflict):
            agent.receive(tampered)
        assert env.starts() == 0
    finally:
        agent.stop()


def test_an_offer_for_a_replaced_session_never_reaches_the_journal(env: Env) -> None:
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        env.db.transaction(
            lambda tx: workers.register(
                tx,
                worker_id="w1",
                session_id=new_id(),
                capabilities=parse_capabilities({"executors": ["local_process"]}),
                max_concurrent_runs=4,
                session_lease_ms=30_000,
            )
        )

        with pytest.raises(FenceConflict):
            agent.receive(offer)
        assert agent.journal.get(offer.offer_id) is None and env.starts() == 0
    finally:
        agent.stop()


def test_an_offer_whose_spec_does_not_match_its_digest_is_refused(env: Env) -> None:
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        forged = dataclasses.replace(offer, spec=dataclasses.replace(offer.spec, environment=(("X", "1"),)))

        with pytest.raises(ValidationFailed):
            agent.receive(forged)
        assert agent.journal.get(offer.offer_id) is None
    finally:
        agent.stop()


@pytest.mark.parametrize("field", ["run_id", "attempt_id"])
def test_an_offer_whose_spec_names_another_attempt_is_refused(env: Env, field: str) -> None:
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        stranger = "01a00000-0000-7000-8000-00000000dead"
        if field == "run_id":
            other = dataclasses.replace(offer.spec, run_id=stranger)
        else:
            other = dataclasses.replace(offer.spec, attempt_id=stranger)
        # the digest matches the swapped spec: only the identity check against the fence refuses it
        forged = dataclasses.replace(offer, spec=other, spec_digest=other.digest())

        with pytest.raises(ValidationFailed) as caught:
            agent.receive(forged)
        assert caught.value.message == "offer spec does not match its digest or identity"
        assert agent.journal.get(offer.offer_id) is None and env.starts() == 0
    finally:
        agent.stop()


@pytest.mark.parametrize("empty_identity", [False, True], ids=["no_trace", "empty_identity_file"])
def test_a_crash_after_the_launching_barrier_is_never_spawned_again(env: Env, empty_identity: bool) -> None:
    # Given a worker that dies after committing `launching`, before the spawn
    offer = _crashed_at(env, "after_launching")
    identity = launch_identity_path(env.home / "worker" / "receipts", offer.fence.attempt_id)
    if empty_identity:
        # (or the empty identity file a shim leaves when its launcher dies before sending the start
        # ticks: the shim then exits without starting the command)
        identity.parent.mkdir(parents=True, exist_ok=True)
        identity.touch(mode=0o600)

    # When a new incarnation starts (no receipt, no process) and the offer comes again
    restarted = env.agent()
    restarted.start()
    try:
        # Then the attempt is reported lost for the reason the worker knows, its journal row is gone
        # (an empty identity file, no evidence, with it), and the offer is refused: it is never spawned
        run = env.db.transaction(lambda tx: runs.get_run(tx, env.project.id, offer.fence.run_id))
        assert (run.status, run.error_code) == ("failed", "RECOVERY_LAUNCH_OUTCOME_UNKNOWN")
        assert restarted.journal.get(offer.offer_id) is None
        assert not identity.exists()
        with pytest.raises(FenceConflict):
            restarted.receive(offer)
        assert env.starts() == 0
    finally:
        restarted.stop()


def test_a_crash_between_the_starting_ack_and_the_barrier_loses_nothing(env: Env) -> None:
    # Given a worker that dies after the starting ACK, before the commit that journals it together
    # with the launching barrier (the journal still says `accepted`, the control plane `starting`)
    offer = _crashed_at(env, "after_starting_ack")

    # When a new incarnation starts and the offer is delivered again
    restarted = env.agent()
    restarted.start()
    try:
        record = restarted.journal.get(offer.offer_id)
        assert record is not None and record.state == "accepted"
        state = restarted.receive(offer)

        # Then the repeated starting ACK is accepted, the command starts exactly once and succeeds
        assert state == "started"
        wait_for(lambda: env.run_status(offer.fence.run_id) == "succeeded")
        assert env.starts() == 1
    finally:
        restarted.stop()


def test_lease_loss_stops_only_our_process_and_the_old_worker_never_writes_lost(env: Env) -> None:
    # Given a running command
    slow = env.db.transaction(
        lambda tx: tasks.edit_task(tx, env.project.id, "t", {"command": f"echo x >> {env.marker}; sleep 30"})
    ).task
    env.task = slow
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        assert agent.receive(offer) == "started"

        # When another session replaces ours (our leases are fenced) and the worker renews
        env.db.transaction(
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

        # Then our process was stopped, the journal says so, and the run was not marked lost by us
        record = agent.journal.get(offer.offer_id)
        assert record is not None and record.state == "recovery_required"
        assert record.recovery_reason == "lease_lost_local_execution_stopped"
        assert env.run_status(offer.fence.run_id) == "running"
        lease = env.db.transaction(lambda tx: leases.get_lease(tx, offer.fence.attempt_id))
        assert lease is not None and lease.status == "leased"
    finally:
        agent.stop()


def test_a_process_that_exits_after_its_session_was_replaced_keeps_its_journal_row(env: Env) -> None:
    # Given a running command whose session another one replaces (its lease is fenced)
    slow = env.db.transaction(
        lambda tx: tasks.edit_task(tx, env.project.id, "t", {"command": f"echo x >> {env.marker}; sleep 30"})
    ).task
    env.task = slow
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        assert agent.receive(offer) == "started"
        env.db.transaction(
            lambda tx: workers.register(
                tx,
                worker_id="w1",
                session_id=new_id(),
                capabilities=parse_capabilities({"executors": ["local_process"]}),
                max_concurrent_runs=4,
                session_lease_ms=30_000,
            )
        )
        record = agent.journal.get(offer.offer_id)
        assert record is not None and record.executor_handle is not None

        # When its process dies by itself (no receipt) and the exit watcher settles it
        os.killpg(ProcessHandle.decode(record.executor_handle).pid, signal.SIGKILL)

        # Then the old worker does not write lost, and the row stays as the evidence of the start
        wait_for(lambda: _state(agent, offer.offer_id) == "recovery_required")
        kept = agent.journal.get(offer.offer_id)
        assert kept is not None and kept.recovery_reason == "process_exited_without_receipt"
        assert env.run_status(offer.fence.run_id) == "running"
        # (the exit watcher's own settle may still be finishing: "settling" until it has)
        wait_for(lambda: agent.settle(offer.fence.attempt_id) == "fenced")
        assert agent.journal.get(offer.offer_id) is not None
    finally:
        agent.stop()


def _state(agent: WorkerAgent, offer_id: str) -> str | None:
    record = agent.journal.get(offer_id)
    return None if record is None else record.state


def test_a_journal_row_is_pruned_as_soon_as_its_attempt_settles(env: Env) -> None:
    # Given a worker running a short command
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        agent.receive(offer)

        # When the run completes and the completion is acknowledged
        wait_for(lambda: env.run_status(offer.fence.run_id) == "succeeded")

        # Then its journal row is gone at once (no retention age to wait for)
        wait_for(lambda: agent.journal.get(offer.offer_id) is None)
        assert agent.journal.audit().total == 0
    finally:
        agent.stop()


def test_a_run_writes_the_journal_four_times_and_never_for_its_running_ack(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker whose every journal write is recorded
    agent = env.agent()
    agent.start()
    writes: list[str] = []
    journal = agent.journal
    real_accept, real_advance = journal.accept, journal.advance

    def accept(offer: Any) -> Any:
        writes.append("accepted")
        return real_accept(offer)

    def advance(offer_id: str, **kwargs: Any) -> Any:
        writes.append(kwargs["to_state"] + (" (pruned)" if kwargs.get("prune") else ""))
        return real_advance(offer_id, **kwargs)

    monkeypatch.setattr(journal, "accept", accept)
    monkeypatch.setattr(journal, "advance", advance)
    try:
        # When a run goes through its whole life, its running ACK confirmed
        offer = env.queue_and_claim(agent)
        assert agent.receive(offer) == "started"
        wait_for(lambda: env.run_status(offer.fence.run_id) == "succeeded")
        wait_for(lambda: journal.get(offer.offer_id) is None)

        # Then the journal was written at the barrier's steps only: the running ACK needs no row
        # (a `started` row found after a crash sends it again, answered as an identical replay)
        assert writes == ["accepted", "launching", "started", "completion_acknowledged (pruned)"]
    finally:
        agent.stop()


def test_a_database_restored_from_before_a_run_does_not_stop_the_worker_from_starting(env: Env) -> None:
    # Given a worker that died after spawning a run whose receipt is now on disk
    offer = _crashed_at(env, "after_spawn")
    receipt = receipt_path(env.home / "worker" / "receipts", offer.fence.attempt_id)
    wait_for(receipt.exists)
    # and a database restored from a backup taken before that run existed
    run_id = offer.fence.run_id
    for table, column in (
        ("run_leases", "run_id"),
        ("run_events", "run_id"),
        ("run_retry_policies", "run_id"),
        ("run_attempts", "run_id"),
        ("runs", "id"),
    ):
        env.db.raw(f"DELETE FROM {table} WHERE {column} = ?", (run_id,))

    # When the worker starts again, then it starts, and the unknown run's record does not stay active
    restarted = env.agent()
    restarted.start()
    try:
        assert restarted.active_count == 0
        record = restarted.journal.get(offer.offer_id)
        assert record is None or record.state in ("recovery_required", "completion_acknowledged")
    finally:
        restarted.stop()


def _crashed_at(env: Env, fault: str) -> Offer:
    """An offer received by a worker that died at ``fault`` (the journal and the control plane left as
    that crash leaves them)."""
    crashing = env.agent(fault=fault)
    crashing.start()
    offer = env.queue_and_claim(crashing)
    with pytest.raises(Crash):
        crashing.receive(offer)
    crashing.stop()
    return offer


def _count_probes(agent: WorkerAgent, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    probes: list[str] = []
    client = agent._intake._ctx.client
    real = client.lease_status

    def probe(fence: Any) -> Any:
        probes.append(fence.attempt_id)
        return real(fence)

    monkeypatch.setattr(client, "lease_status", probe)
    return probes


def test_a_fresh_offer_is_not_probed_before_its_journal_write_and_an_older_one_is(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given offers claimed for requests the worker sent just now, and one sent longer ago
    agent = env.agent()
    agent.start()
    try:
        probes = _count_probes(agent, monkeypatch)
        asked = time.monotonic()
        fresh = env.queue_and_claim(agent)
        assert agent.receive(fresh, asked_at=asked) == "started"
        assert probes == []  # its lease was granted after `asked`: live by construction
        older = env.queue_and_claim(agent)
        assert agent.receive(older, asked_at=time.monotonic() - FRESH_OFFER_S) == "started"
        unknown = env.queue_and_claim(agent)
        assert agent.receive(unknown) == "started"
        assert probes == [older.fence.attempt_id, unknown.fence.attempt_id]
    finally:
        agent.stop()


def test_a_fresh_offer_whose_session_was_replaced_is_never_spawned(env: Env) -> None:
    # Given an offer claimed just now, and then the worker's session replaced
    agent = env.agent()
    agent.start()
    try:
        asked = time.monotonic()
        offer = env.queue_and_claim(agent)
        env.db.transaction(
            lambda tx: workers.register(
                tx,
                worker_id="w1",
                session_id=new_id(),
                capabilities=parse_capabilities({"executors": ["local_process"]}),
                max_concurrent_runs=4,
                session_lease_ms=30_000,
            )
        )
        # Then the starting ACK (fenced) refuses it before any spawn: the fence holds without the probe
        with pytest.raises(FenceConflict):
            agent.receive(offer, asked_at=asked)
        assert env.starts() == 0
    finally:
        agent.stop()


def test_a_lease_reacquired_by_the_same_session_is_a_new_offer_and_starts_once(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an offer journaled as accepted whose starting ACK failed (nothing spawned, the attempt
    # forgotten), and its lease then expired: the run is queued again under the same attempt
    agent = env.agent()
    agent.start()
    try:
        first = env.queue_and_claim(agent)
        client = agent._intake._ctx.client
        real_ack = client.ack_starting

        def unreachable(fence: Any) -> Any:
            raise ControlPlaneUnreachable("down for a moment")

        monkeypatch.setattr(client, "ack_starting", unreachable)
        with pytest.raises(ControlPlaneUnreachable):
            agent.receive(first)
        monkeypatch.setattr(client, "ack_starting", real_ack)
        assert _state(agent, first.offer_id) == "accepted" and env.starts() == 0
        attempt_id = first.fence.attempt_id
        env.db.raw(
            "UPDATE run_leases SET expires_at_ms = renewed_at_ms + 1 WHERE attempt_id = ?", (attempt_id,)
        )
        time.sleep(0.01)
        assert env.db.transaction(lambda tx: lease_expiry.expire_lease(tx, attempt_id)) == "released"

        # When the same worker session claims it again and receives the new offer
        d = RunDispatcher(env.db, lease_secret=b"k" * 32, budget=DispatchBudget(), incarnation_started_ms=0)
        second = d.dispatch_once().offer
        assert second is not None
        assert (second.fence.attempt_id, second.fence.session_id) == (attempt_id, first.fence.session_id)
        assert second.fence.lease_generation == first.fence.lease_generation + 1

        # Then it is not taken for a repeat of the first: journaled on its own and started, once
        assert agent.receive(second) == "started"
        assert second.offer_id != first.offer_id and _state(agent, first.offer_id) == "accepted"
        wait_for(lambda: env.run_status(second.fence.run_id) == "succeeded")
        assert env.starts() == 1
    finally:
        agent.stop()
