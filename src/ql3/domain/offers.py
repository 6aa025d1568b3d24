"""ExecutionSpec, its digest, and the claimed execution offer (docs/contracts.md §1.7 and §8)."""

from __future__ import annotations

import copy
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from ql3.domain.digests import canonical_json, sha256_hex
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import MAX_COMMAND_BYTES, MAX_GRACE_MS, MAX_TIMEOUT_MS

OFFER_ID_DOMAIN: Final = "qinglong-run-dispatch-offer-v1"
LEASE_TOKEN_DOMAIN: Final = b"ql3.run-lease-token.v1"
_SPEC_KEYS: Final = frozenset(
    {
        "runId",
        "attemptId",
        "projectId",
        "taskId",
        "taskRevision",
        "command",
        "workingDirectory",
        "environmentPolicy",
        "environment",
        "timeoutMs",
        "terminationGraceMs",
    }
)


def offer_id(
    attempt_id: str, lease_generation: int, worker_id: str, session_id: str, worker_generation: int
) -> str:
    """Stable per lease generation, so a crash between claim and first delivery replays the same id."""
    raw = "\0".join(
        [OFFER_ID_DOMAIN, attempt_id, str(lease_generation), worker_id, session_id, str(worker_generation)]
    )
    return hashlib.sha256(raw.encode()).hexdigest()


def derive_lease_token(secret: bytes, attempt_id: str, lease_generation: int) -> str:
    """A control-plane-derived lease token: re-derivable for recovery, so only its digest is stored."""
    mac = hmac.new(
        secret, LEASE_TOKEN_DOMAIN + b"\0" + f"{attempt_id}\0{lease_generation}".encode(), "sha256"
    )
    return mac.hexdigest()


_IDENT_RE: Final = re.compile(r"[^\x00-\x1f]{1,255}")


def _ident(value: object, what: str) -> str:
    if not isinstance(value, str) or _IDENT_RE.fullmatch(value) is None:
        raise ValidationFailed(f"invalid {what}", field=what)
    return value


def normalize_spec(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate and deep-copy an ExecutionSpec, stripping unknown fields, in digest key order."""
    src = copy.deepcopy({k: v for k, v in raw.items() if k in _SPEC_KEYS})
    cmd = src.get("command")
    if not isinstance(cmd, dict) or cmd.get("kind") != "shell" or not isinstance(cmd.get("command"), str):
        raise ValidationFailed("invalid command", field="command")
    if (
        "\x00" in cmd["command"]
        or len(cmd["command"].encode()) > MAX_COMMAND_BYTES
        or not cmd["command"].strip()
    ):
        raise ValidationFailed("invalid command", field="command")
    out: dict[str, Any] = {
        "runId": _ident(src.get("runId"), "runId"),
        "attemptId": _ident(src.get("attemptId"), "attemptId"),
        "projectId": _ident(src.get("projectId"), "projectId"),
        "taskId": _ident(src.get("taskId"), "taskId"),
        "taskRevision": _ident(str(src.get("taskRevision")), "taskRevision"),
        "command": {"kind": "shell", "command": cmd["command"]},
    }
    cwd = src.get("workingDirectory")
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd:
            raise ValidationFailed("invalid workingDirectory", field="workingDirectory")
        out["workingDirectory"] = cwd
    policy = src.get("environmentPolicy", "inherit")
    if policy not in ("inherit", "isolated"):
        raise ValidationFailed("invalid environmentPolicy", field="environmentPolicy")
    out["environmentPolicy"] = policy
    env = src.get("environment", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValidationFailed("invalid environment", field="environment")
    out["environment"] = dict(sorted(env.items()))
    timeout = src.get("timeoutMs")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= MAX_TIMEOUT_MS:
            raise ValidationFailed("invalid timeoutMs", field="timeoutMs")
        out["timeoutMs"] = timeout
    grace = src.get("terminationGraceMs", 5000)
    if isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE_MS:
        raise ValidationFailed("invalid terminationGraceMs", field="terminationGraceMs")
    out["terminationGraceMs"] = grace
    return out


def spec_digest(spec: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(spec))


DeliveryKind = Literal["new_claim", "lease_recovery"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseFence:
    """Everything a worker must present to act on a lease."""

    run_id: str
    attempt_id: str
    worker_id: str
    session_id: str
    worker_generation: int
    lease_generation: int
    lease_token: str
    lease_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """A claimed execution offer. Holds the lease token and the spec: never logged or returned by
    management surfaces; delivered only to its one worker."""

    offer_id: str
    delivery_kind: DeliveryKind
    fence: LeaseFence
    lease_expires_at_ms: int
    spec: dict[str, Any]
    spec_digest: str
    placement_score: int | None

    def __repr__(self) -> str:  # the spec and token never reach a log line by accident
        return f"Offer(offer_id={self.offer_id[:12]}…, kind={self.delivery_kind})"

    def to_json(self) -> str:
        return canonical_json(
            {
                "offerId": self.offer_id,
                "deliveryKind": self.delivery_kind,
                "fence": {
                    "runId": self.fence.run_id,
                    "attemptId": self.fence.attempt_id,
                    "workerId": self.fence.worker_id,
                    "sessionId": self.fence.session_id,
                    "workerGeneration": self.fence.worker_generation,
                    "leaseGeneration": self.fence.lease_generation,
                    "leaseToken": self.fence.lease_token,
                    "leaseVersion": self.fence.lease_version,
                },
                "leaseExpiresAtMs": self.lease_expires_at_ms,
                "spec": self.spec,
                "specDigest": self.spec_digest,
                "placementScore": self.placement_score,
            }
        )

    @staticmethod
    def from_json(data: dict[str, Any]) -> Offer:
        f = data["fence"]
        return Offer(
            offer_id=data["offerId"],
            delivery_kind=data["deliveryKind"],
            fence=LeaseFence(
                run_id=f["runId"],
                attempt_id=f["attemptId"],
                worker_id=f["workerId"],
                session_id=f["sessionId"],
                worker_generation=int(f["workerGeneration"]),
                lease_generation=int(f["leaseGeneration"]),
                lease_token=f["leaseToken"],
                lease_version=int(f["leaseVersion"]),
            ),
            lease_expires_at_ms=int(data["leaseExpiresAtMs"]),
            spec=data["spec"],
            spec_digest=data["specDigest"],
            placement_score=data.get("placementScore"),
        )
