"""Log shipping over the worker API (docs/cluster.md "Log shipping"): the route's fences and bad
input, the logs route of a replica without log files serving the shipped log, ``complete`` only once
the worker closed it, and a real remote worker's shipper sending a real process's output."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application.attempt_logs import MAX_CHUNK_BYTES
from ql3.application.gateway import InProcessControlPlane
from ql3.cluster.log_shipper import LogShipper
from ql3.cluster.pull import PullService
from ql3.cluster.remote import RemoteWorker
from ql3.cluster.runtime import WorkerApi
from ql3.cluster.stops import StopWatch
from ql3.http.app import create_app
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.config import WorkerConfig
from tests.support.cluster_api import P, plane, pull, register, task_and_run, wait_status, worker_token
from tests.support.http import bearer
from tests.support.waits import wait_for

CAP = 4096


@pytest.fixture
def api_client(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    """A replica: the worker API, no embedded worker, no log files (logs_root None)."""
    notifier = db.notifier
    api = WorkerApi(
        control_plane=InProcessControlPlane(db),
        pull_service=PullService(db),
        stop_watch=StopWatch(
            db, counters=notifier.counters, wait_past=notifier.wait_past, notify=notifier.notify
        ),
        control_owner="cp-test",
        cancel_lease_ms=30_000,
        log_cap_bytes=CAP,
    )
    with TestClient(create_app(db, extensions=[api])) as client:
        yield client


def chunk(session: Any, attempt_id: str, offset: int, data: bytes, final: bool = False) -> dict[str, Any]:
    return {
        "sessionId": session.session_id,
        "generation": session.generation,
        "attemptId": attempt_id,
        "offset": offset,
        "data": base64.b64encode(data).decode(),
        "final": final,
    }


def logs(client: TestClient, owner: dict[str, str], run_id: str, offset: int = 0) -> dict[str, Any]:
    resp = client.get(f"{P}/runs/{run_id}/logs", params={"offset": offset}, headers=owner)
    assert resp.status_code == 200, resp.text
    page: dict[str, Any] = resp.json()
    return page


def test_the_route_stores_chunks_any_reader_sees_and_refuses_what_it_must(
    api_client: TestClient, owner: dict[str, str]
) -> None:
    # Given a lease held by w1, and w2 with its own session
    w1_token = worker_token(api_client, owner, "w1")
    w2_token = worker_token(api_client, owner, "w2")
    w1, w2 = plane(api_client, w1_token), plane(api_client, w2_token)
    s1, s2 = register(w1, "w1"), register(w2, "w2")
    run = task_and_run(api_client, owner, "job", "sleep 60")
    offer = pull(w1, s1)
    attempt = offer.fence.attempt_id
    url = "/api/v1/worker/logs"

    # Nothing shipped yet: the replica (no log files) answers an empty page, not logs_unavailable
    empty = logs(api_client, owner, run["id"])
    assert (empty["data"], empty["eof"], empty["complete"]) == ("", True, False)

    # When w1 ships two chunks, and one again
    first = api_client.post(url, json=chunk(s1, attempt, 0, b"one\n"), headers=bearer(w1_token))
    again = api_client.post(url, json=chunk(s1, attempt, 0, b"one\n"), headers=bearer(w1_token))
    api_client.post(url, json=chunk(s1, attempt, 4, b"two\n"), headers=bearer(w1_token))
    assert first.status_code == 200 and first.json()["result"] == "appended"
    assert again.json() == {"result": "replayed", "storedBytes": 4, "truncated": False, "closed": False}
    # Then any reader sees them, and the log is not complete while the run goes on
    page = logs(api_client, owner, run["id"])
    assert (page["data"], page["next_offset"]) == ("one\ntwo\n", 8)
    assert page["eof"] is True and page["complete"] is False

    # And the route refuses a gap, another worker's session, bad base64 and an oversized chunk
    gap = api_client.post(url, json=chunk(s1, attempt, 20, b"x"), headers=bearer(w1_token))
    assert gap.status_code == 409 and gap.json()["error"]["code"] == "log_gap"
    assert gap.json()["error"]["details"]["stored_bytes"] == 8
    foreign = api_client.post(url, json=chunk(s2, attempt, 8, b"x"), headers=bearer(w2_token))
    assert foreign.status_code == 409 and foreign.json()["error"]["code"] == "fence_conflict"
    mine_as_other = api_client.post(url, json=chunk(s1, attempt, 8, b"x"), headers=bearer(w2_token))
    assert mine_as_other.status_code == 409
    bad = {**chunk(s1, attempt, 8, b"x"), "data": "not base64!"}
    assert api_client.post(url, json=bad, headers=bearer(w1_token)).status_code == 422
    big = chunk(s1, attempt, 8, b"x" * (MAX_CHUNK_BYTES + 1))
    refused = api_client.post(url, json=big, headers=bearer(w1_token))
    assert refused.status_code in (413, 422)
    owner_call = api_client.post(url, json=chunk(s1, attempt, 8, b"x"), headers=owner)
    assert owner_call.status_code == 403
    assert logs(api_client, owner, run["id"])["data"] == "one\ntwo\n"


def test_a_terminal_run_is_complete_once_its_log_is_closed_and_the_quota_shows_the_marker(
    api_client: TestClient, owner: dict[str, str], db: SqliteDatabase
) -> None:
    token = worker_token(api_client, owner, "w1")
    w1 = plane(api_client, token)
    s1 = register(w1, "w1")
    run = task_and_run(api_client, owner, "job", "true")
    offer = pull(w1, s1)
    attempt = offer.fence.attempt_id
    url = "/api/v1/worker/logs"
    api_client.post(url, json=chunk(s1, attempt, 0, b"a" * 4000), headers=bearer(token))
    # The run ends (as the worker's completion would), but the worker has not closed the log yet
    db.raw("UPDATE runs SET status = 'succeeded' WHERE id = ?", (run["id"],))
    db.raw("UPDATE run_attempts SET finished_at_ms = created_at_ms + 1, status = 'succeeded'")
    assert logs(api_client, owner, run["id"], 4000)["complete"] is False

    # When the final chunk crosses the quota (4096 bytes here)
    crossing = api_client.post(url, json=chunk(s1, attempt, 4000, b"b" * 200, True), headers=bearer(token))
    assert crossing.json()["truncated"] is True and crossing.json()["storedBytes"] == CAP

    # Then readers see the first 4096 bytes, the marker, and the log is complete
    page = logs(api_client, owner, run["id"], 4000)
    assert page["data"] == "b" * 96 + "\n[ql3: log truncated at 4096 bytes]\n"
    assert page["complete"] is True
    raw = api_client.get(f"{P}/runs/{run['id']}/logs/raw", headers=owner)
    marker = b"\n[ql3: log truncated at 4096 bytes]\n"
    assert raw.status_code == 200 and raw.content == b"a" * 4000 + b"b" * 96 + marker


class _Sink:
    """A control plane that loses the first answer of each chunk once (the chunk was stored)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int, bool]] = []
        self.lost: set[int] = set()

    def ship_log(self, session: Any, *, attempt_id: str, offset: int, data: bytes, final: bool) -> Any:
        self.calls.append((offset, len(data), final))
        ack = self.inner.ship_log(session, attempt_id=attempt_id, offset=offset, data=data, final=final)
        if offset not in self.lost:
            self.lost.add(offset)
            from ql3.ports.control_plane import ControlPlaneUnreachable

            raise ControlPlaneUnreachable(reason="lost_response")
        return ack


def test_the_shipper_resends_a_lost_chunk_identically_and_closes_the_log_when_settled(
    api_client: TestClient, owner: dict[str, str], tmp_path: Path
) -> None:
    # Given a leased attempt and its local log file with more than one chunk of output
    token = worker_token(api_client, owner, "w1")
    w1 = plane(api_client, token)
    s1 = register(w1, "w1")
    run = task_and_run(api_client, owner, "job", "sleep 60")
    attempt = pull(w1, s1).fence.attempt_id
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    content = b"".join(b"line %05d\n" % i for i in range(300))  # 3,300 bytes
    (logs_dir / f"{attempt}.log").write_bytes(content)
    sink = _Sink(w1)
    shipper = LogShipper(sink, logs_dir, lambda: s1, chunk_bytes=1024, linger_s=0.0)
    shipper.track(attempt)

    # When it ships cycle by cycle (each first answer lost), then the attempt settles
    for _ in range(20):
        shipper.ship_once()
    shipper.settled(attempt)
    for _ in range(20):
        shipper.ship_once()

    # Then every chunk was stored once, the resends were identical, and the log is closed
    page = logs(api_client, owner, run["id"])
    assert page["data"].encode() == content
    offsets = [c[0] for c in sink.calls if c[1]]
    assert offsets == sorted(offsets) and len(offsets) == 2 * len(set(offsets))
    assert sink.calls[-1][2] is True  # the final one
    assert shipper.tracked == []


def test_a_remote_worker_ships_its_process_output_to_the_replica(
    api_client: TestClient, owner: dict[str, str], tmp_path: Path
) -> None:
    # Given a remote worker attached to a replica without log files
    token = worker_token(api_client, owner, "w1")
    config = WorkerConfig(worker_id="w1", home=tmp_path / "w1")
    remote = RemoteWorker(plane(api_client, token), config)
    assert remote.start()
    try:
        # When a task prints numbered lines
        run = task_and_run(api_client, owner, "lines", "for i in 1 2 3 4 5; do echo line $i; done")
        assert wait_status(api_client, owner, run["id"], {"succeeded", "failed"})["status"] == "succeeded"

        # Then the replica serves the whole output, and the page is complete once it was closed
        deadline = time.monotonic() + 30
        page = logs(api_client, owner, run["id"])
        while not page["complete"] and time.monotonic() < deadline:
            time.sleep(0.05)
            page = logs(api_client, owner, run["id"])
        assert page["complete"] is True
        assert page["data"] == "".join(f"line {i}\n" for i in range(1, 6))
    finally:
        remote.stop(offline=True)


def test_a_restarted_worker_resumes_shipping_a_readopted_process_without_duplicating_a_byte(
    api_client: TestClient, owner: dict[str, str], tmp_path: Path
) -> None:
    # Given a remote worker running a task that prints, then waits for the test at two gates
    token = worker_token(api_client, owner, "w1")
    config = WorkerConfig(worker_id="w1", home=tmp_path / "w1")
    first = RemoteWorker(plane(api_client, token), config)
    assert first.start()
    one, two = tmp_path / "gate1", tmp_path / "gate2"
    wait = "while [ ! -f {} ]; do sleep 0.05; done"
    command = f"echo before; {wait.format(one)}; echo after; {wait.format(two)}; echo end"
    run = task_and_run(api_client, owner, "gated", command)
    wait_for(lambda: logs(api_client, owner, run["id"])["data"] == "before\n")

    # When it stops at once (the process goes on) and starts again on the same home
    first.stop(offline=False)
    second = RemoteWorker(plane(api_client, token), config)
    assert second.start()
    try:
        # Then what the re-adopted process writes reaches the replica while it still runs
        one.touch()
        wait_for(lambda: logs(api_client, owner, run["id"])["data"] == "before\nafter\n")
        assert api_client.get(f"{P}/runs/{run['id']}", headers=owner).json()["status"] == "running"
        two.touch()
        assert wait_status(api_client, owner, run["id"], {"succeeded", "failed"})["status"] == "succeeded"

        # And the replica holds the whole output once, in order, and the log was closed
        wait_for(lambda: logs(api_client, owner, run["id"])["complete"])
        assert logs(api_client, owner, run["id"])["data"] == "before\nafter\nend\n"
    finally:
        second.stop(offline=True)


def test_a_remote_workers_completion_carries_its_log_so_the_log_needs_no_request_of_its_own(
    api_client: TestClient, owner: dict[str, str], tmp_path: Path
) -> None:
    # Given a remote worker whose requests are recorded
    token = worker_token(api_client, owner, "w1")
    control = plane(api_client, token)
    sent: list[tuple[str, Any]] = []
    control._client.event_hooks["request"].append(
        lambda request: sent.append((request.url.path, json.loads(request.content or b"null")))
    )
    remote = RemoteWorker(control, WorkerConfig(worker_id="w1", home=tmp_path / "w1"))
    assert remote.start()
    try:
        # When a short task prints and ends
        run = task_and_run(api_client, owner, "short", "echo done")
        assert wait_status(api_client, owner, run["id"], {"succeeded", "failed"})["status"] == "succeeded"
        wait_for(lambda: logs(api_client, owner, run["id"])["complete"])

        # Then the log was closed by the completion's batch, never by a request of its own
        assert logs(api_client, owner, run["id"])["data"] == "done\n"
        closing = [
            steps
            for path, body in sent
            if path == "/api/v1/worker/batch"
            for steps in [[s["step"] for s in body["steps"]]]
            if "append_log" in steps
        ]
        assert closing == [["append_log", "complete"]]
        assert not [b for p, b in sent if p == "/api/v1/worker/logs" and b["final"]]
    finally:
        remote.stop(offline=True)
