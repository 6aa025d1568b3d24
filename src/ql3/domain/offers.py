"""The claimed execution offer and its journaled form (docs/contracts.md §1.7 and §8). The spec it
carries is the typed ``ExecutionSpec`` (domain/execution.py); the offer's JSON holds its wire form,
validated once by ``ExecutionSpec.from_wire`` when an offer is parsed (``Offer.from_json``)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypedDict

from ql3.domain.digests import canonical_json
from ql3.domain.execution import ExecutionSpec, JournalSpec
from ql3.domain.tasks import validate_env

OFFER_ID_DOMAIN: Final = "qinglong-run-dispatch-offer-v1"
LEASE_TOKEN_DOMAIN: Final = b"ql3.run-lease-token.v1"


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


def _fence_json(fence: LeaseFence) -> dict[str, Any]:
    return {
        "runId": fence.run_id,
        "attemptId": fence.attempt_id,
        "workerId": fence.worker_id,
        "sessionId": fence.session_id,
        "workerGeneration": fence.worker_generation,
        "leaseGeneration": fence.lease_generation,
        "leaseToken": fence.lease_token,
        "leaseVersion": fence.lease_version,
    }


def _fence_from_json(f: dict[str, Any]) -> LeaseFence:
    return LeaseFence(
        run_id=f["runId"],
        attempt_id=f["attemptId"],
        worker_id=f["workerId"],
        session_id=f["sessionId"],
        worker_generation=int(f["workerGeneration"]),
        lease_generation=int(f["leaseGeneration"]),
        lease_token=f["leaseToken"],
        lease_version=int(f["leaseVersion"]),
    )


def _offer_json(
    offer: Offer | JournaledOffer,
    spec: dict[str, Any],
    fence: LeaseFence,
    shared: dict[str, str] | None = None,
) -> str:
    """The one JSON layout of an offer, delivered (full spec) or journaled (trimmed spec). A delivered
    offer carries the project's variables beside its spec (``sharedEnvironment``, outside the digest)."""
    body: dict[str, Any] = {
        "offerId": offer.offer_id,
        "deliveryKind": offer.delivery_kind,
        "fence": _fence_json(fence),
        "leaseExpiresAtMs": offer.lease_expires_at_ms,
        "spec": spec,
        "specDigest": offer.spec_digest,
        "placementScore": offer.placement_score,
    }
    if shared:
        body["sharedEnvironment"] = shared
    return canonical_json(body)


class _Envelope(TypedDict):
    """Everything of an offer but its spec."""

    offer_id: str
    delivery_kind: DeliveryKind
    fence: LeaseFence
    lease_expires_at_ms: int
    spec_digest: str
    placement_score: int | None


def _envelope_from_json(data: dict[str, Any]) -> _Envelope:
    return _Envelope(
        offer_id=data["offerId"],
        delivery_kind=data["deliveryKind"],
        fence=_fence_from_json(data["fence"]),
        lease_expires_at_ms=int(data["leaseExpiresAtMs"]),
        spec_digest=data["specDigest"],
        placement_score=data.get("placementScore"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """A claimed execution offer. Holds the lease token and the spec: never logged or returned by
    management surfaces; delivered only to its one worker."""

    offer_id: str
    delivery_kind: DeliveryKind
    fence: LeaseFence
    lease_expires_at_ms: int
    spec: ExecutionSpec
    spec_digest: str
    placement_score: int | None

    def __repr__(self) -> str:  # the spec and token never reach a log line by accident
        return f"Offer(offer_id={self.offer_id[:12]}…, kind={self.delivery_kind})"

    def to_json(self) -> str:
        return _offer_json(self, self.spec.to_wire(), self.fence, dict(self.spec.shared_environment))

    @staticmethod
    def from_json(data: dict[str, Any]) -> Offer:
        """Parse a received offer; its spec and the project's variables are validated here
        (``ExecutionSpec.from_wire``, ``validate_env``)."""
        spec = ExecutionSpec.from_wire(data["spec"])
        shared = validate_env(data.get("sharedEnvironment") or {}, "sharedEnvironment")
        return Offer(
            **_envelope_from_json(data), spec=replace(spec, shared_environment=tuple(shared.items()))
        )

    def journaled(self) -> JournaledOffer:
        """The offer as the worker journal stores it: the spec without its secrets and the fence
        without its lease token (the journal keeps the token sealed beside it)."""
        return JournaledOffer(
            offer_id=self.offer_id,
            delivery_kind=self.delivery_kind,
            fence=self.fence,
            lease_expires_at_ms=self.lease_expires_at_ms,
            spec=self.spec.journaled(),
            spec_digest=self.spec_digest,
            placement_score=self.placement_score,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JournaledOffer:
    """An offer as the worker journal keeps it (``JournalRecord.offer_json``): the same JSON layout as
    ``Offer.to_json`` with the spec trimmed to a ``JournalSpec`` and an empty lease token."""

    offer_id: str
    delivery_kind: DeliveryKind
    fence: LeaseFence
    lease_expires_at_ms: int
    spec: JournalSpec
    spec_digest: str
    placement_score: int | None

    def __repr__(self) -> str:
        return f"JournaledOffer(offer_id={self.offer_id[:12]}…, kind={self.delivery_kind})"

    def to_json(self) -> str:
        """Never holds the lease token, whatever the fence carries."""
        return _offer_json(self, self.spec.to_wire(), replace(self.fence, lease_token=""))

    @staticmethod
    def from_json(data: dict[str, Any]) -> JournaledOffer:
        return JournaledOffer(**_envelope_from_json(data), spec=JournalSpec.from_wire(data["spec"]))
