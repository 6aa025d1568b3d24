"""The worker API of ``ql3 control`` over HTTP (docs/cluster.md): worker credentials, a credential
acting for its own worker only, the agent running a real process through ``HttpControlPlane``, the
stop through lease control settled before it is released, and late ACKs of a replaced session."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application.gateway import InProcessControlPlane
from ql3.cluster import http_control_plane
from ql3.cluster.auth_cache import REVOCATION_DELAY_S, WorkerAuthCache
from ql3.cluster.http_control_plane import HttpControlPlane
from ql3.cluster.pull import PullService
from ql3.cluster.remote import RemoteWorker
from ql3.cluster.runtime import WorkerApi
from ql3.cluster.stops import StopWatch
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import FenceConflict, NotFound, PermissionDenied, ValidationFailed
from ql3.execution.identity import ProcessHandle, probe
from ql3.http.app import create_app
from ql3.ports.control_plane import MAX_BATCH_STEPS, ControlPlaneUnreachable
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.agent import WorkerAgent
from ql3.worker.config import WorkerConfig
from tests.support.cluster_api import P, plane, pull, register, task_and_run, wait_status, worker_token
from tests.support.http import bearer


@pytest.fixture
def api_client(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    notifier = db.notifier
    api = WorkerApi(
        control_plane=InProcessControlPlane(db),
        pull_service=PullService(db),
        stop_watch=StopWatch(
            db, counters=notifier.counters, wait_past=notifier.wait_past, notify=notifier.notify
        ),
        control_owner="cp-test",
        cancel_lease_ms=30_000,
    )
    with TestClient(create_app(db, extensions=[api])) as client:
        yield client


def test_worker_credentials_are_created_by_the_owner_and_speak_only_the_worker_api(
    api_client: TestClient, owner: dict[str, str], make_token: Any
) -> None:
    # Given a credential the owner created for w1
    token = worker_token(api_client, owner, "w1")
    # Then it is bound to w1, shown once, and a second active one for w1 is refused
    assert api_client.get("/api/v1/worker/identity", headers=bearer(token)).json() == {"workerId": "w1"}
    again = api_client.post("/api/v1/worker-tokens", json={"workerId": "w1"}, headers=owner)
    assert again.status_code == 409 and again.json()["error"]["code"] == "worker_token_exists"
    listed = api_client.get("/api/v1/worker-tokens", headers=owner).json()["items"]
    assert [t["worker_id"] for t in listed] == ["w1"] and "token" not in listed[0]
    # And only the owner or an admin of default creates them
    viewer = make_token("viewer", name="v")
    denied = api_client.post("/api/v1/worker-tokens", json={"workerId": "w2"}, headers=viewer)
    assert denied.status_code == 403
    # And the management API refuses a worker credential, the worker API a management one
    assert api_client.get(f"{P}/runs", headers=bearer(token)).status_code == 403
    assert api_client.get("/api/v1/whoami", headers=bearer(token)).status_code == 403
    refused = api_client.get("/api/v1/worker/identity", headers=owner)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "worker_credential_required"
    # And a revoked credential is refused once the worker API's memory of it (at most
    # REVOCATION_DELAY_S) has passed: the clock of that memory is moved here, not waited for
    now = [0.0]
    api_client.app.state.worker_auth_cache = WorkerAuthCache(clock=lambda: now[0])  # type: ignore[attr-defined]
    assert api_client.get("/api/v1/worker/identity", headers=bearer(token)).status_code == 200
    revoked = api_client.post(f"/api/v1/worker-tokens/{listed[0]['id']}/revoke", headers=owner)
    assert revoked.status_code == 200 and revoked.json()["revoked_at_ms"] is not None
    assert api_client.get("/api/v1/worker/identity", headers=bearer(token)).status_code == 200
    now[0] += REVOCATION_DELAY_S
    assert api_client.get("/api/v1/worker/identity", headers=bearer(token)).status_code == 401
    now[0] += 60.0  # and a refusal is never remembered as an acceptance
    assert api_client.get("/api/v1/worker/identity", headers=bearer(token)).status_code == 401


def test_a_worker_credential_cannot_act_for_another_worker(
    api_client: TestClient, owner: dict[str, str]
) -> None:
    # Given w2 holding a lease, and a credential of w1
    w1_token = worker_token(api_client, owner, "w1")
    w1 = plane(api_client, w1_token)
    w2 = plane(api_client, worker_token(api_client, owner, "w2"))
    session2 = register(w2, "w2")
    task_and_run(api_client, owner, "job", "true")
    offer = pull(w2, session2)

    # When w1 presents w2's fence (naming w2), or heartbeats w2's session
    with pytest.raises(PermissionDenied) as caught:
        w1.ack_starting(offer.fence)
    assert caught.value.details["code"] == "worker_mismatch"
    for call in (
        lambda: w1.renew(offer.fence, 30_000),
        lambda: w1.complete(offer.fence, callback_sequence=1, callback_token="x", exit_code=0),
        lambda: w1.report_lost(offer.fence, error_code="X"),
        lambda: w1.lease_control(offer.fence),
        lambda: w1.lease_status(offer.fence),
    ):
        with pytest.raises(PermissionDenied):
            call()
    with pytest.raises(FenceConflict):
        w1.heartbeat(session2)  # checked against w1's registry row: w1 has no such session
    # And a registration with w1's credential is always w1's, whatever the session
    raw = TestClient(api_client.app).post(
        "/api/v1/worker/register",
        json={
            "sessionId": session2.session_id,
            "capabilities": {"executors": ["local_process"]},
            "maxConcurrentRuns": 2,
            "sessionLeaseMs": 30_000,
        },
        headers=bearer(w1_token),
    )
    assert raw.status_code == 200 and raw.json()["workerId"] == "w1"

    # Then w2's lease is untouched and w2 itself may act on it
    assert w2.ack_starting(offer.fence)[0] == "starting"


def test_an_identity_forged_in_the_fence_is_fenced(api_client: TestClient, owner: dict[str, str]) -> None:
    w1 = plane(api_client, worker_token(api_client, owner, "w1"))
    w2 = plane(api_client, worker_token(api_client, owner, "w2"))
    register(w1, "w1")
    session2 = register(w2, "w2")
    task_and_run(api_client, owner, "job", "true")
    offer = pull(w2, session2)
    forged = dataclasses.replace(offer.fence, worker_id="w1")  # w2's lease, w1's name
    with pytest.raises(FenceConflict) as caught:
        w1.ack_starting(forged)
    assert caught.value.details["reason"] == "worker_mismatch"


def test_a_remote_agent_runs_a_real_process_and_completes_it(
    api_client: TestClient, owner: dict[str, str], tmp_path: Path
) -> None:
    # Given an agent whose control plane is the HTTP one
    p = plane(api_client, worker_token(api_client, owner, "w1"))
    agent = WorkerAgent(p, WorkerConfig(worker_id="w1", home=tmp_path / "w1"), clock=lambda: 0)
    agent.start()
    try:
        run = task_and_run(api_client, owner, "hello", f"echo hi > {tmp_path / 'out'}")
        assert agent.session is not None
        # When it pulls and receives the offer
        offer = pull(p, agent.session)
        assert agent.receive(offer) in ("started", "completion_acknowledged")
        # Then the run succeeds through the HTTP completion
        done = wait_status(api_client, owner, run["id"], {"succeeded", "failed"})
        assert done["status"] == "succeeded"
        assert (tmp_path / "out").read_text() == "hi\n"
    finally:
        agent.stop()


def test_a_stop_is_released_only_after_its_dispatch_is_settled(
    api_client: TestClient, owner: dict[str, str], db: SqliteDatabase, tmp_path: Path
) -> None:
    # Given a remote agent running a long task that ignores TERM (so it is still running, and its
    # lease still live, when the stop is asked for again: KILL follows after the 3 s grace)
    p = plane(api_client, worker_token(api_client, owner, "w1"))
    agent = WorkerAgent(p, WorkerConfig(worker_id="w1", home=tmp_path / "w1"), clock=lambda: 0)
    agent.start()
    try:
        run = task_and_run(api_client, owner, "sleeper", "trap '' TERM; sleep 60", grace_ms=3000)
        assert agent.session is not None
        offer = pull(p, agent.session)
        assert agent.receive(offer) == "started"
        # Lease control without a stop intent says run, and creates no dispatch
        assert p.lease_control(offer.fence) == "run"
        assert db.raw("SELECT count(*) AS n FROM cancellation_dispatches")[0]["n"] == 0

        # When an operator cancels it, the worker's stop long-poll learns of it
        assert api_client.post(f"{P}/runs/{run['id']}/cancel", headers=owner).status_code == 200
        assert p.stops(agent.session, wait_ms=20_000, known=[]) == [offer.fence.attempt_id]
        decision = agent.control_stop(offer.fence.attempt_id)

        # Then the stop was released with the dispatch already committed as dispatched
        assert decision == "stop_requested"
        [dispatch] = db.raw("SELECT status, last_result FROM cancellation_dispatches")
        assert (dispatch["status"], dispatch["last_result"]) == ("dispatched", "termination_requested")
        # And asking again replays it (no second dispatch, no second event)
        events = db.raw("SELECT count(*) AS n FROM run_events WHERE type = 'run.cancel_dispatched'")[0]["n"]
        assert p.lease_control(offer.fence) == "stop_requested"
        assert (
            db.raw("SELECT count(*) AS n FROM run_events WHERE type = 'run.cancel_dispatched'")[0]["n"]
            == events
            == 1
        )
        # And the process group was signalled: the run ends cancelled
        done = wait_status(api_client, owner, run["id"], {"cancelled", "failed", "succeeded"})
        assert done["status"] == "cancelled"
    finally:
        agent.stop()


def test_late_acks_of_a_replaced_session_are_refused(api_client: TestClient, owner: dict[str, str]) -> None:
    # Given a lease pulled by one session of w1
    p = plane(api_client, worker_token(api_client, owner, "w1"))
    old = register(p, "w1")
    task_and_run(api_client, owner, "job", "true")
    offer = pull(p, old)

    # When w1 registers a new session (a restart elsewhere, or after being cut off)
    new = register(p, "w1")
    assert new.generation == old.generation + 1

    # Then every late call of the old session is refused by the fence
    for call in (
        lambda: p.ack_starting(offer.fence),
        lambda: p.renew(offer.fence, 30_000),
        lambda: p.lease_status(offer.fence),
        lambda: p.heartbeat(old),
    ):
        with pytest.raises(FenceConflict):
            call()


def test_a_completion_over_http_carries_its_stop_cause_and_needs_no_live_session(
    api_client: TestClient, owner: dict[str, str]
) -> None:
    # Given a running attempt of w1, without a timeout
    token = worker_token(api_client, owner, "w1")
    p = plane(api_client, token)
    session = register(p, "w1")
    run = task_and_run(api_client, owner, "job", "true")
    offer = pull(p, session)
    p.ack_starting(offer.fence)
    p.ack_running(
        offer.fence,
        pid=4242,
        handle="ql3lp1.test",
        log_artifact_id="a",
        callback_sequence=1,
        callback_token_digest=sha256_hex("cb"),
    )
    fence = dataclasses.asdict(offer.fence)
    body = {
        "fence": {
            "workerId": fence["worker_id"],
            "runId": fence["run_id"],
            "attemptId": fence["attempt_id"],
            "sessionId": fence["session_id"],
            "workerGeneration": fence["worker_generation"],
            "leaseGeneration": fence["lease_generation"],
            "leaseToken": fence["lease_token"],
            "leaseVersion": fence["lease_version"],
        },
        "callbackSequence": 1,
        "callbackToken": "cb",
        "exitCode": 143,
    }
    # When a completion names an unknown stop cause, or a timeout the attempt never had
    unknown = TestClient(api_client.app).post(
        "/api/v1/worker/complete", json={**body, "stopCause": "crash"}, headers=bearer(token)
    )
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "validation_failed"
    with pytest.raises(ValidationFailed):
        p.complete(offer.fence, callback_sequence=1, callback_token="cb", exit_code=143, stop_cause="timeout")
    # Then nothing changed; and after w1 registered a new session, the old session's fence stop is
    # still its attempt's fact: the attempt is lost (never failed by the stop), the run goes on to
    # lost retry (none here: failed LEASE_FENCED)
    register(p, "w1")
    assert p.complete(
        offer.fence, callback_sequence=1, callback_token="cb", exit_code=143, stop_cause="fence"
    ) == ("applied", "failed")
    final = api_client.get(f"{P}/runs/{run['id']}", headers=owner).json()
    assert (final["status"], final["error_code"], final["exit_code"]) == ("failed", "LEASE_FENCED", 143)


class CutOff:
    """The HTTP control plane behind a link the test can cut: every call of the protocol fails."""

    def __init__(self, inner: HttpControlPlane) -> None:
        self.inner = inner
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if callable(attr) and name not in ("register", "close"):

            def guarded(*args: Any, **kwargs: Any) -> Any:
                if self.cut:
                    raise ControlPlaneUnreachable(reason="cut")
                return attr(*args, **kwargs)

            return guarded
        return attr


def test_a_worker_cut_off_stops_its_process_before_its_lease_can_expire(
    api_client: TestClient, owner: dict[str, str], tmp_path: Path
) -> None:
    # Given a remote agent running a long task, on a clock the test moves
    link = CutOff(plane(api_client, worker_token(api_client, owner, "w1")))
    now = [1_000_000]
    config = WorkerConfig(worker_id="w1", home=tmp_path / "w1")
    agent = WorkerAgent(link, config, clock=lambda: now[0])
    agent.start()
    try:
        task_and_run(api_client, owner, "sleeper", "sleep 300")
        assert agent.session is not None
        offer = pull(link.inner, agent.session)
        assert agent.receive(offer) == "started"
        record = agent.journal.get(offer.offer_id)
        assert record is not None and record.executor_handle is not None
        handle = ProcessHandle.decode(record.executor_handle)

        # When the link is cut and one renewal period passes, the process keeps running
        link.cut = True
        now[0] += config.run_lease_ms // 3
        with pytest.raises(ControlPlaneUnreachable):
            agent.maintain()
        assert probe(handle) == "running"

        # Then after two renewal periods without a renewal it is stopped, before the lease can expire
        now[0] += config.run_lease_ms // 3
        with pytest.raises(ControlPlaneUnreachable):
            agent.maintain()
        # (the stop returns once the group is signalled; the exit watcher reaps the shim)
        deadline = time.monotonic() + 20
        while probe(handle) != "exited" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert probe(handle) == "exited"
        after = agent.journal.get(offer.offer_id)
        assert after is not None and after.state == "recovery_required"
        assert after.recovery_reason == "lease_lost_local_execution_stopped"
    finally:
        agent.stop()


class Crash(Exception):
    """The worker dies at a fault point."""


def test_a_restarted_remote_worker_resumes_an_offer_it_journaled_but_never_spawned(
    api_client: TestClient, owner: dict[str, str], db: SqliteDatabase, tmp_path: Path
) -> None:
    # Given a worker that died right after journaling an offer (before its starting ACK)
    token = worker_token(api_client, owner, "w1")
    config = WorkerConfig(worker_id="w1", home=tmp_path / "w1")

    def die(point: str) -> None:
        if point == "after_accept":
            raise Crash(point)

    client = plane(api_client, token)
    first = WorkerAgent(client, config, clock=lambda: 0, fault=die)
    first.start()
    marker = tmp_path / "ran"
    run = task_and_run(api_client, owner, "resumed", f"echo once >> {marker}")
    assert first.session is not None
    offer = pull(client, first.session)
    with pytest.raises(Crash):
        first.receive(offer)
    first.stop()

    # When it starts again on the same home
    remote = RemoteWorker(plane(api_client, token), config)
    assert remote.start()
    try:
        # Then the journaled offer is re-delivered by a replay-only pull and runs, once
        done = wait_status(api_client, owner, run["id"], {"succeeded", "failed"})
        assert done["status"] == "succeeded"
        assert marker.read_text() == "once\n"
        # under the lease it was first claimed with, not after that lease expired and a re-claim
        assert [r["lease_generation"] for r in db.raw("SELECT lease_generation FROM run_leases")] == [1]
    finally:
        remote.stop(offline=True)


def test_a_batch_of_lease_steps_answers_each_step_as_its_own_route_would(
    api_client: TestClient, owner: dict[str, str]
) -> None:
    # Given two runs leased to w1, and w1's credential
    token = worker_token(api_client, owner, "w1")
    w1 = plane(api_client, token)
    session = register(w1, "w1")
    task_and_run(api_client, owner, "job", "true")
    assert api_client.post(f"{P}/tasks/job/runs", json={}, headers=owner).status_code == 201
    a, b = pull(w1, session), pull(w1, session)
    fence_a = http_control_plane._fence(a.fence)
    fence_b = http_control_plane._fence(b.fence)
    other = {**fence_b, "workerId": "w2"}

    # When one request carries steps for both, one naming another worker and one malformed
    steps = [
        {"step": "ack_starting", "body": {"fence": fence_a}},
        {"step": "ack_starting", "body": {"fence": other}},
        {"step": "renew", "body": {"fence": fence_b, "leaseMs": "soon"}},
        {"step": "ack_starting", "body": {"fence": fence_b}},
        {"step": "lease_status", "body": {"fence": fence_a}},
    ]
    reply = api_client.post("/api/v1/worker/batch", json={"steps": steps}, headers=bearer(token))

    # Then every step has its own answer: the refusals stay with their steps
    assert reply.status_code == 200
    answers = reply.json()["answers"]
    assert [x["status"] for x in answers] == [200, 403, 422, 200, 200]
    assert answers[0]["body"]["result"] == "starting" and answers[3]["body"]["result"] == "starting"
    assert answers[1]["body"]["error"]["code"] == "worker_mismatch"
    assert answers[4]["body"]["result"] == "leased" and answers[4]["body"]["leaseRemainingMs"] > 0
    # And the batch itself is bounded, and refused whole when it is not a list of steps
    too_many = {"steps": [steps[0]] * (MAX_BATCH_STEPS + 1)}
    assert api_client.post("/api/v1/worker/batch", json=too_many, headers=bearer(token)).status_code == 422
    assert (
        api_client.post("/api/v1/worker/batch", json={"steps": []}, headers=bearer(token)).status_code == 422
    )


def test_the_worker_sends_steps_that_meet_as_one_batch_and_falls_back_to_single_calls(
    api_client: TestClient, owner: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = worker_token(api_client, owner, "w1")
    w1 = plane(api_client, token)
    session = register(w1, "w1")
    task_and_run(api_client, owner, "job", "true")
    assert api_client.post(f"{P}/tasks/job/runs", json={}, headers=owner).status_code == 201
    a, b = pull(w1, session), pull(w1, session)
    forged = dataclasses.replace(b.fence, lease_token="forged-token")
    posted: list[str] = []
    real_post = w1._post

    def counting_post(path: str, body: Any, **kw: Any) -> Any:
        posted.append(path)
        return real_post(path, body, **kw)

    monkeypatch.setattr(w1, "_post", counting_post)
    step = http_control_plane._Step
    answers = w1._send_steps(
        [step("ack_starting", {"fence": http_control_plane._fence(f)}) for f in (a.fence, forged, b.fence)],
        window_s=1.0,
    )
    assert posted == ["/api/v1/worker/batch"]
    assert answers[0]["result"] == "starting" and answers[2]["result"] == "starting"
    assert isinstance(answers[1], FenceConflict)  # raised to that step's caller only

    # A replica from before batches answers 404 to the batch route: one call per step from then on
    posted.clear()

    def old_replica(path: str, body: Any, **kw: Any) -> Any:
        posted.append(path)
        if path == "/api/v1/worker/batch":
            raise NotFound()
        return real_post(path, body, **kw)

    monkeypatch.setattr(w1, "_post", old_replica)
    again = w1._send_steps(
        [step("lease_status", {"fence": http_control_plane._fence(f)}) for f in (a.fence, b.fence)],
        window_s=1.0,
    )
    assert [x["result"] for x in again] == ["leased", "leased"]
    assert posted == ["/api/v1/worker/batch", "/api/v1/worker/lease-status", "/api/v1/worker/lease-status"]
