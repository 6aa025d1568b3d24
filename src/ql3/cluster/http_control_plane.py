"""``HttpControlPlane``: the ``ControlPlane`` port over the worker API of ``ql3 control``.

Errors come back as the same domain exceptions the in-process plane raises (``FenceConflict`` with
its reason, ``Conflict``, ``ValidationFailed``...), so the worker agent behaves identically. A
transport failure or a 5xx is retried with backoff within the call's window (every call of this
protocol is replay-safe: ACKs answer ``already_*``, completion ``already_terminal``, a pull returns
the same offer); past the window it raises ``ControlPlaneUnreachable``. A renewal whose first
response was lost is resolved with ``lease_status`` (its version moved on: the renewal committed).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, Protocol

import httpx

from ql3.application.attempt_logs import LogGap, LogOverlap
from ql3.cluster.liveness import Liveness, Unresponsive
from ql3.cluster.pull import OfferConflict
from ql3.domain.errors import (
    Conflict,
    FenceConflict,
    NotFound,
    PermissionDenied,
    Ql3Error,
    Unauthenticated,
    ValidationFailed,
)
from ql3.domain.offers import LeaseFence, Offer
from ql3.ports.control_plane import MAX_BATCH_STEPS, ControlPlaneUnreachable, LeaseInfo, SessionInfo
from ql3.worker.group_commit import GroupCommit

log = logging.getLogger("ql3.worker.http")
SHORT_WINDOW_S: Final = 3.0
# Heartbeats and renewals are periodic: a short window, so that a worker cut off notices within a
# fraction of its lease (its agent stops what it can no longer renew).
RENEW_WINDOW_S: Final = 1.0
BACKOFF_FIRST_S: Final = 0.1
BACKOFF_MAX_S: Final = 2.0
# A replica that accepts a connection and never answers (hung, SIGSTOP) is left after the read timeout
# (a short call) or an unanswered liveness probe (a long-poll, cluster/liveness.py): docs/cluster.md
# "Timings". A long-poll's read timeout is its wait plus READ_TIMEOUT_S.
CONNECT_TIMEOUT_S: Final = 2.0
READ_TIMEOUT_S: Final = 4.0
_CONFLICTS: Final[dict[str, type[Conflict]]] = {
    FenceConflict.code: FenceConflict,
    OfferConflict.code: OfferConflict,
    LogGap.code: LogGap,
    LogOverlap.code: LogOverlap,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAck:
    """The server's answer to one shipped log chunk."""

    result: str  # appended | replayed | truncated | dropped
    stored_bytes: int
    truncated: bool
    closed: bool


class FinalLogs(Protocol):
    """Where a completion finds the rest of its attempt's log (the log shipper)."""

    def take_final(self, attempt_id: str) -> tuple[int, bytes] | None: ...

    def final_answer(self, attempt_id: str, ack: LogAck | Ql3Error | None, *, shipped: int = 0) -> None: ...


def _log_ack(reply: dict[str, Any]) -> LogAck:
    return LogAck(
        result=str(reply["result"]),
        stored_bytes=int(reply["storedBytes"]),
        truncated=bool(reply["truncated"]),
        closed=bool(reply["closed"]),
    )


def _fence(f: LeaseFence) -> dict[str, Any]:
    return {
        "workerId": f.worker_id,
        "runId": f.run_id,
        "attemptId": f.attempt_id,
        "sessionId": f.session_id,
        "workerGeneration": f.worker_generation,
        "leaseGeneration": f.lease_generation,
        "leaseToken": f.lease_token,
        "leaseVersion": f.lease_version,
    }


def _session(data: dict[str, Any]) -> SessionInfo:
    return SessionInfo(
        worker_id=str(data["workerId"]),
        session_id=str(data["sessionId"]),
        generation=int(data["generation"]),
        status=str(data["status"]),
        outcome=str(data["outcome"]),
    )


def _lease(data: dict[str, Any]) -> LeaseInfo:
    remaining = data.get("leaseRemainingMs")
    return LeaseInfo(
        version=int(data["leaseVersion"]),
        expires_at_ms=int(data["leaseExpiresAtMs"]),
        remaining_ms=int(remaining) if isinstance(remaining, int) and remaining >= 0 else None,
    )


@dataclass(frozen=True, slots=True)
class _Step:
    """One lease step on its way: the name of its route and its wire body."""

    name: str
    body: dict[str, Any]


_STEP_ROUTES: Final[dict[str, str]] = {
    "ack_starting": "/api/v1/worker/ack/starting",
    "ack_running": "/api/v1/worker/ack/running",
    "ack_start_failure": "/api/v1/worker/ack/start-failure",
    "complete": "/api/v1/worker/complete",
    "report_lost": "/api/v1/worker/lost",
    "lease_status": "/api/v1/worker/lease-status",
}


def raise_for(status: int, body: Any) -> None:
    """Map an error response of the worker API to its domain exception."""
    error = body.get("error", {}) if isinstance(body, dict) else {}
    code = str(error.get("code", ""))
    message = str(error.get("message", "")) or None
    raw = error.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if status == 409:
        raise _CONFLICTS.get(code, Conflict)(message, **details)
    if status == 422:
        raise ValidationFailed(message, **details)
    if status == 401:
        raise Unauthenticated(message)
    if status == 403:
        raise PermissionDenied(message, code=code)
    if status == 404:
        raise NotFound(message)
    raise Ql3Error(message, status=status, code=code)


class HttpControlPlane:
    """Thread-safe (one ``httpx.Client`` with a connection pool)."""

    def __init__(
        self,
        server: str | list[str],
        token: str,
        *,
        ca: str | None = None,
        ack_window_s: float = 60.0,
        client: httpx.Client | None = None,
    ) -> None:
        """``server``: one replica's URL, or several: a call that cannot reach one (connection
        refused, timeout, 5xx) moves on to the next, so a worker outlives the loss of its replica.
        ``client``: an already configured client (tests pass the app's TestClient)."""
        self._servers = [u.rstrip("/") for u in ([server] if isinstance(server, str) else server)]
        if not self._servers:
            raise ValueError("at least one server")
        self._current = 0
        verify: ssl.SSLContext | bool = True
        if ca is not None:
            verify = ssl.create_default_context(cafile=ca)
        if client is not None:
            client.headers["Authorization"] = f"Bearer {token}"
        self._client = client or httpx.Client(
            headers={"Authorization": f"Bearer {token}", "User-Agent": "ql3-worker"},
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            verify=verify,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
        )
        self._ack_window_s = ack_window_s
        self._own_timeouts = client is None  # a given client keeps its own
        # With another replica to move to, a long-poll's replica is probed while it waits.
        self._liveness = Liveness(self._client) if len(self._servers) > 1 else None
        self._closed = threading.Event()
        # Lease steps from several threads at once travel together (worker/group_commit.py): the ACKs,
        # completions and loss reports within the ACK window, lease probes within the short one.
        self._batch_route = True  # False once a replica without the batch route answered 404
        self._multi_pull = True  # False once a replica refused a pull of several pairs (422)
        # A completion carries the rest of its attempt's log when it fits one chunk (one request and
        # one transaction fewer per run); False once a replica refused the step (an older one).
        self.final_logs: FinalLogs | None = None
        self._log_step = True
        self._acks: GroupCommit[_Step, Any] = GroupCommit(
            lambda steps: self._send_steps(steps, window_s=self._ack_window_s), max_batch=MAX_BATCH_STEPS
        )
        self._probes: GroupCommit[_Step, Any] = GroupCommit(
            lambda steps: self._send_steps(steps, window_s=SHORT_WINDOW_S), max_batch=MAX_BATCH_STEPS
        )

    @property
    def server(self) -> str:
        return self._servers[self._current]

    def _next_server(self, failed: str, *, reason: str = "", since: float | None = None) -> None:
        if len(self._servers) > 1 and self._servers[self._current] == failed:
            self._current = (self._current + 1) % len(self._servers)
            # silent_ms: how long the replica left had not answered anything (bounded: cluster/liveness.py)
            silent = None
            if self._liveness is not None and since is not None:
                silent = self._liveness.silent_ms(failed, since)
            log.warning(
                "moving to another replica",
                extra={"action": "worker.failover", "error": reason, "silent_ms": silent},
            )

    def close(self) -> None:
        self._closed.set()
        self._client.close()
        if self._liveness is not None:
            self._liveness.close()

    def _post(
        self,
        path: str,
        body: dict[str, Any] | None,
        *,
        window_s: float,
        read_timeout_s: float | None = None,
        long_poll: bool = False,
    ) -> Any:
        return self._call(
            "POST", path, body, window_s=window_s, read_timeout_s=read_timeout_s, long_poll=long_poll
        )

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        window_s: float,
        read_timeout_s: float | None = None,
        long_poll: bool = False,
    ) -> Any:
        deadline = time.monotonic() + window_s
        delay = BACKOFF_FIRST_S
        timeout = httpx.Timeout(read_timeout_s or READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        while True:
            server = self.server
            url = server + path
            sent = time.monotonic()

            def send(url: str = url) -> httpx.Response:
                if self._own_timeouts:
                    return self._client.request(method, url, json=body, timeout=timeout)
                return self._client.request(method, url, json=body)

            try:
                if long_poll and self._liveness is not None:
                    response = self._liveness.long_poll(server, send)
                else:
                    response = send()
                if self._liveness is not None:
                    self._liveness.answered(server)
                if response.status_code < 500:
                    data = response.json() if response.content else {}
                    if response.status_code >= 400:
                        raise_for(response.status_code, data)
                    return data
                failure = f"http_{response.status_code}"
            except (httpx.TransportError, json.JSONDecodeError, Unresponsive) as exc:
                failure = type(exc).__name__
            except RuntimeError:  # the client was closed underneath us (shutdown)
                raise ControlPlaneUnreachable("the worker is shutting down") from None
            self._next_server(server, reason=failure, since=sent)
            if time.monotonic() + delay > deadline or self._closed.is_set():
                raise ControlPlaneUnreachable(reason=failure)
            log.info(
                "control plane unreachable, retrying", extra={"action": "worker.retry", "error": failure}
            )
            self._closed.wait(delay * (0.5 + random.random()))
            delay = min(BACKOFF_MAX_S, delay * 2)

    # -- batches of lease steps ----------------------------------------------------------------------

    def _send_steps(self, steps: Sequence[_Step], *, window_s: float) -> list[Any]:
        """One step: its own route (the idle path, unchanged). Several: one ``/worker/batch``
        request, one answer (the body, or the domain exception of a refusal) per step."""
        if len(steps) == 1 or not self._batch_route:
            return [self._single(step, window_s=window_s) for step in steps]
        body = {"steps": [{"step": step.name, "body": step.body} for step in steps]}
        try:
            data = self._post("/api/v1/worker/batch", body, window_s=window_s)
        except NotFound:  # a replica from before batches (a rolling upgrade): one call per step
            self._batch_route = False
            return [self._single(step, window_s=window_s) for step in steps]
        answers = data.get("answers") if isinstance(data, dict) else None
        if not isinstance(answers, list) or len(answers) != len(steps):
            raise ControlPlaneUnreachable(reason="malformed_batch_answer")
        out: list[Any] = []
        for answer in answers:
            status = int(answer.get("status", 500)) if isinstance(answer, dict) else 500
            reply = answer.get("body", {}) if isinstance(answer, dict) else {}
            if status >= 400:
                try:
                    raise_for(status, reply)
                except Ql3Error as exc:
                    out.append(exc)
                    continue
            out.append(reply)
        return out

    def _single(self, step: _Step, *, window_s: float) -> Any:
        path, body = _STEP_ROUTES.get(step.name, ""), step.body
        if step.name == "append_log":  # alone, a chunk goes to the log route
            fence = step.body["fence"]
            path = "/api/v1/worker/logs"
            body = {
                "sessionId": fence["sessionId"],
                "generation": fence["workerGeneration"],
                "attemptId": fence["attemptId"],
                **{k: step.body[k] for k in ("offset", "data", "final")},
            }
        try:
            return self._post(path, body, window_s=window_s)
        except ControlPlaneUnreachable:
            raise
        except Ql3Error as exc:  # a refusal answers this step alone
            return exc

    def _ack(self, name: str, body: dict[str, Any]) -> Any:
        return self._acks.call(_Step(name, body))

    # -- identity and session -----------------------------------------------------------------------

    def identity(self, *, window_s: float = SHORT_WINDOW_S) -> str:
        return str(self._call("GET", "/api/v1/worker/identity", None, window_s=window_s)["workerId"])

    def register(
        self,
        *,
        worker_id: str,
        session_id: str,
        capabilities: dict[str, Any],
        max_concurrent_runs: int,
        session_lease_ms: int,
    ) -> SessionInfo:
        data = self._post(
            "/api/v1/worker/register",
            {
                "sessionId": session_id,
                "capabilities": capabilities,
                "maxConcurrentRuns": max_concurrent_runs,
                "sessionLeaseMs": session_lease_ms,
            },
            window_s=SHORT_WINDOW_S,
        )
        info = _session(data)
        if info.worker_id != worker_id:
            raise PermissionDenied("the credential belongs to another worker id", code="worker_mismatch")
        return info

    def heartbeat(self, session: SessionInfo) -> SessionInfo:
        body = {"sessionId": session.session_id, "generation": session.generation}
        return _session(self._post("/api/v1/worker/heartbeat", body, window_s=RENEW_WINDOW_S))

    def set_status(self, session: SessionInfo, status: str) -> SessionInfo:
        body = {"sessionId": session.session_id, "generation": session.generation, "status": status}
        return _session(self._post("/api/v1/worker/status", body, window_s=SHORT_WINDOW_S))

    # -- pull and stops -----------------------------------------------------------------------------

    def pull(
        self,
        session: SessionInfo,
        *,
        offer_id: str,
        lease_token: str,
        wait_ms: int,
        replay_only: bool = False,
    ) -> Offer | None:
        """One long-poll for one run (see ``pull_many``)."""
        offers = self.pull_many(
            session, pairs=[(offer_id, lease_token)], wait_ms=wait_ms, replay_only=replay_only
        )
        return offers[0] if offers else None

    def pull_many(
        self,
        session: SessionInfo,
        *,
        pairs: Sequence[tuple[str, str]],
        wait_ms: int,
        replay_only: bool = False,
        fresh: bool = False,
    ) -> list[Offer]:
        """One long-poll proposing ``pairs`` (offer id, lease token), one per free slot: up to one
        offer per pair. Raises ``ControlPlaneUnreachable`` at once on a transport failure (the caller
        retries with the same pairs, and so gets the same offers if the first pull claimed; ``fresh``
        only for pairs never sent before). A replica
        that knows only single pulls (an older version, 422 on ``more``) is asked for one run."""
        if not pairs:
            raise ValueError("at least one pair")
        body: dict[str, Any] = {
            "sessionId": session.session_id,
            "generation": session.generation,
            "offerId": pairs[0][0],
            "leaseToken": pairs[0][1],
            "waitMs": wait_ms,
            "replayOnly": replay_only,
        }
        if fresh and self._multi_pull:
            body["fresh"] = True
        if len(pairs) > 1 and self._multi_pull:
            body["more"] = [{"offerId": o, "leaseToken": t} for o, t in pairs[1:]]
        post = partial(
            self._post,
            "/api/v1/worker/pull",
            window_s=0.0,
            read_timeout_s=wait_ms / 1000 + READ_TIMEOUT_S,
            long_poll=wait_ms > 0,
        )
        try:
            data = post(body)
        except ValidationFailed:
            if "more" not in body and "fresh" not in body:
                raise
            body.pop("more", None)  # refused before anything was claimed: ask as an older replica knows
            body.pop("fresh", None)
            data = post(body)
            self._multi_pull = False  # only once one pair alone was accepted
        raw = data.get("offers")
        if not isinstance(raw, list):  # an older replica: one offer or none
            raw = [] if data.get("offer") is None else [data["offer"]]
        return [Offer.from_json(offer) for offer in raw]

    def stops(self, session: SessionInfo, *, wait_ms: int, known: list[str]) -> list[str]:
        data = self._post(
            "/api/v1/worker/stops",
            {
                "sessionId": session.session_id,
                "generation": session.generation,
                "waitMs": wait_ms,
                "known": known[:1024],
            },
            window_s=0.0,
            read_timeout_s=wait_ms / 1000 + READ_TIMEOUT_S,
            long_poll=wait_ms > 0,
        )
        return [str(a) for a in data.get("attemptIds", [])]

    # -- the lease protocol -------------------------------------------------------------------------

    def ack_starting(self, fence: LeaseFence) -> tuple[str, LeaseInfo]:
        data = self._ack("ack_starting", {"fence": _fence(fence)})
        return str(data["result"]), _lease(data)

    def ack_running(
        self,
        fence: LeaseFence,
        *,
        pid: int,
        handle: str,
        log_artifact_id: str,
        callback_sequence: int,
        callback_token_digest: str,
    ) -> tuple[str, LeaseInfo]:
        data = self._ack(
            "ack_running",
            {
                "fence": _fence(fence),
                "pid": pid,
                "handle": handle,
                "logArtifactId": log_artifact_id,
                "callbackSequence": callback_sequence,
                "callbackTokenDigest": callback_token_digest,
            },
        )
        return str(data["result"]), _lease(data)

    def ack_start_failure(self, fence: LeaseFence, *, error_code: str) -> str:
        data = self._ack("ack_start_failure", {"fence": _fence(fence), "errorCode": error_code})
        return str(data["outcome"])

    def renew(self, fence: LeaseFence, lease_ms: int) -> LeaseInfo:
        body = {"fence": _fence(fence), "leaseMs": lease_ms}
        try:
            return _lease(self._post("/api/v1/worker/renew", body, window_s=0.0))
        except ControlPlaneUnreachable:
            pass  # the renewal may have committed: retry, and accept a version that moved on
        try:
            return _lease(self._post("/api/v1/worker/renew", body, window_s=RENEW_WINDOW_S))
        except FenceConflict as exc:
            if exc.details.get("reason") != "version_mismatch":
                raise
            return self.lease_status(fence)

    def complete(
        self,
        fence: LeaseFence,
        *,
        callback_sequence: int,
        callback_token: str,
        exit_code: int,
        stop_cause: Literal["timeout", "fence"] | None = None,
    ) -> tuple[str, str]:
        body: dict[str, Any] = {
            "fence": _fence(fence),
            "callbackSequence": callback_sequence,
            "callbackToken": callback_token,
            "exitCode": exit_code,
        }
        if stop_cause is not None:
            body["stopCause"] = stop_cause
        data = self._complete_with_log(fence, body) or self._ack("complete", body)
        return str(data["result"]), str(data["outcome"])

    def _complete_with_log(self, fence: LeaseFence, body: dict[str, Any]) -> dict[str, Any] | None:
        """The last chunk of the attempt's log and its completion as one batch (one request, one
        transaction): the chunk's answer goes to the shipper, the completion's to the caller. None
        when there is no such chunk (the shipper then closes the log itself)."""
        logs = self.final_logs
        if logs is None or not self._log_step or not self._batch_route:
            return None
        tail = logs.take_final(fence.attempt_id)
        if tail is None:
            return None
        offset, data = tail
        chunk = {
            "fence": _fence(fence),
            "offset": offset,
            "data": base64.b64encode(data).decode("ascii"),
            "final": True,
        }
        try:
            log_answer, answer = self._send_steps(
                [_Step("append_log", chunk), _Step("complete", body)], window_s=self._ack_window_s
            )
        except ValidationFailed:  # a replica that does not know the step refused the whole batch
            self._log_step = False
            logs.final_answer(fence.attempt_id, None)
            return None
        except BaseException:
            logs.final_answer(fence.attempt_id, None)
            raise
        if isinstance(log_answer, Ql3Error):
            logs.final_answer(fence.attempt_id, log_answer)
        else:
            logs.final_answer(fence.attempt_id, _log_ack(log_answer), shipped=len(data))
        if isinstance(answer, Ql3Error):
            raise answer
        return dict(answer)

    def report_lost(self, fence: LeaseFence, *, error_code: str) -> bool:
        data = self._ack("report_lost", {"fence": _fence(fence), "errorCode": error_code})
        return bool(data["lost"])

    def lease_status(self, fence: LeaseFence) -> LeaseInfo:
        return _lease(self._probes.call(_Step("lease_status", {"fence": _fence(fence)})))

    def lease_control(self, fence: LeaseFence) -> str:
        data = self._post("/api/v1/worker/lease-control", {"fence": _fence(fence)}, window_s=SHORT_WINDOW_S)
        return str(data["decision"])

    # -- log shipping ---------------------------------------------------------------------------------

    def ship_log(
        self, session: SessionInfo, *, attempt_id: str, offset: int, data: bytes, final: bool
    ) -> LogAck:
        """One chunk, one try (the shipper retries on its next tick with the same bytes)."""
        body = {
            "sessionId": session.session_id,
            "generation": session.generation,
            "attemptId": attempt_id,
            "offset": offset,
            "data": base64.b64encode(data).decode("ascii"),
            "final": final,
        }
        return _log_ack(self._post("/api/v1/worker/logs", body, window_s=0.0))
