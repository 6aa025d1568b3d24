"""A remote worker's completion carries the last chunk of its attempt's log (docs/cluster.md "Log
shipping"): one batch request for both, the chunk's answer handed to the shipper, the completion's to
the caller; a replica that does not know the step gets the completion alone from then on."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ql3.application.attempt_logs import LogGap
from ql3.cluster.http_control_plane import HttpControlPlane, LogAck
from ql3.cluster.log_shipper import LogShipper
from ql3.domain.errors import FenceConflict, Ql3Error
from ql3.domain.offers import LeaseFence
from ql3.ports.control_plane import SessionInfo

FENCE = LeaseFence(
    run_id="r" * 26,
    attempt_id="a" * 26,
    worker_id="w1",
    session_id="s" * 26,
    worker_generation=1,
    lease_generation=1,
    lease_token="t" * 43,
    lease_version=3,
)


class _Logs:
    def __init__(self, tail: tuple[int, bytes] | None) -> None:
        self.tail = tail
        self.answers: list[tuple[LogAck | Ql3Error | None, int]] = []

    def take_final(self, attempt_id: str) -> tuple[int, bytes] | None:
        assert attempt_id == FENCE.attempt_id
        return self.tail

    def final_answer(self, attempt_id: str, ack: LogAck | Ql3Error | None, *, shipped: int = 0) -> None:
        self.answers.append((ack, shipped))


def _plane(handler: Any, logs: _Logs) -> tuple[HttpControlPlane, list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        status, body = handler(request.url.path, json.loads(request.content))
        return httpx.Response(status, json=body)

    client = httpx.Client(transport=httpx.MockTransport(record))
    plane = HttpControlPlane("http://replica", "ql3w_test", client=client)
    plane.final_logs = logs
    return plane, seen


def _complete(plane: HttpControlPlane) -> tuple[str, str]:
    return plane.complete(FENCE, callback_sequence=1, callback_token="c" * 43, exit_code=0)


LOG_OK = {"status": 200, "body": {"result": "appended", "storedBytes": 9, "truncated": False, "closed": True}}
DONE = {"status": 200, "body": {"result": "applied", "outcome": "succeeded"}}


def test_the_last_chunk_and_the_completion_are_one_request() -> None:
    logs = _Logs((5, b"tail\n"))
    plane, seen = _plane(lambda path, body: (200, {"answers": [LOG_OK, DONE]}), logs)

    assert _complete(plane) == ("applied", "succeeded")

    [(path, body)] = seen
    assert path == "/api/v1/worker/batch"
    assert [s["step"] for s in body["steps"]] == ["append_log", "complete"]
    log_step = body["steps"][0]["body"]
    assert (log_step["offset"], base64.b64decode(log_step["data"]), log_step["final"]) == (5, b"tail\n", True)
    [(ack, shipped)] = logs.answers
    assert isinstance(ack, LogAck) and ack.closed and shipped == 5


def test_a_refused_chunk_goes_back_to_the_shipper_and_a_refused_completion_to_the_caller() -> None:
    gap = {"status": 409, "body": {"error": {"code": "log_gap", "details": {"stored_bytes": 2}}}}
    fenced = {"status": 409, "body": {"error": {"code": "fence_conflict", "details": {}}}}
    logs = _Logs((5, b"tail\n"))
    plane, _ = _plane(lambda path, body: (200, {"answers": [gap, fenced]}), logs)

    with pytest.raises(FenceConflict):
        _complete(plane)

    [(ack, shipped)] = logs.answers
    assert isinstance(ack, LogGap) and ack.details["stored_bytes"] == 2 and shipped == 0


def test_without_a_chunk_the_completion_goes_alone() -> None:
    logs = _Logs(None)
    plane, seen = _plane(lambda path, body: (200, DONE["body"]), logs)

    assert _complete(plane) == ("applied", "succeeded")
    assert [p for p, _ in seen] == ["/api/v1/worker/complete"]
    assert logs.answers == []


def test_a_replica_that_does_not_know_the_step_gets_the_completion_alone_from_then_on() -> None:
    def older(path: str, body: Any) -> tuple[int, Any]:
        if path == "/api/v1/worker/batch":  # its batch model refuses the unknown step: nothing ran
            return 422, {"error": {"code": "validation_failed", "details": {}}}
        return 200, DONE["body"]

    logs = _Logs((0, b"x"))
    plane, seen = _plane(older, logs)

    assert _complete(plane) == ("applied", "succeeded")
    assert _complete(plane) == ("applied", "succeeded")

    assert [p for p, _ in seen] == [
        "/api/v1/worker/batch",
        "/api/v1/worker/complete",
        "/api/v1/worker/complete",
    ]
    assert logs.answers == [(None, 0)]  # the shipper sends the chunk itself


class _Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[int, bytes, bool]] = []

    def ship_log(
        self, session: SessionInfo, *, attempt_id: str, offset: int, data: bytes, final: bool
    ) -> LogAck:
        self.calls.append((offset, data, final))
        return LogAck(result="appended", stored_bytes=offset + len(data), truncated=False, closed=final)


SESSION = SessionInfo(worker_id="w1", session_id="s" * 26, generation=1, status="online", outcome="current")


def _shipper(tmp_path: Path, content: bytes) -> tuple[LogShipper, _Sink]:
    (tmp_path / f"{FENCE.attempt_id}.log").write_bytes(content)
    sink = _Sink()
    shipper = LogShipper(sink, tmp_path, lambda: SESSION, chunk_bytes=16, linger_s=0.0)
    shipper.track(FENCE.attempt_id)
    return shipper, sink


def test_the_shipper_hands_over_the_rest_and_sends_nothing_more_once_it_was_stored(tmp_path: Path) -> None:
    shipper, sink = _shipper(tmp_path, b"0123456789abcdefXYZ")
    shipper.ship_once()
    assert sink.calls == [(0, b"0123456789abcdef", False), (16, b"XYZ", False)]
    with (tmp_path / f"{FENCE.attempt_id}.log").open("ab") as fh:
        fh.write(b"!!")  # the command's last words

    assert shipper.take_final(FENCE.attempt_id) == (19, b"!!")
    shipper.ship_once()  # handed over: the shipper leaves it alone
    assert len(sink.calls) == 2
    shipper.final_answer(
        FENCE.attempt_id, LogAck(result="appended", stored_bytes=21, truncated=False, closed=True), shipped=2
    )
    shipper.settled(FENCE.attempt_id)
    shipper.ship_once()

    assert len(sink.calls) == 2 and shipper.tracked == []  # stored and closed with the completion


def test_an_unanswered_or_oversized_rest_is_shipped_by_the_shipper_itself(tmp_path: Path) -> None:
    shipper, sink = _shipper(tmp_path, b"x" * 40)
    assert shipper.take_final(FENCE.attempt_id) is None  # more than one chunk is left

    shipper.ship_once()
    assert shipper.take_final(FENCE.attempt_id) == (40, b"")  # all shipped: an empty closing chunk
    shipper.final_answer(FENCE.attempt_id, None)  # the batch's answer was lost
    shipper.settled(FENCE.attempt_id)
    shipper.ship_once()

    assert sink.calls[-1] == (40, b"", True)
