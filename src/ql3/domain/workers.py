"""Worker identity, capabilities and placement (docs/contracts.md §1.5)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal

from ql3.domain.digests import canonical_json, sha256_hex
from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import Preference

WORKER_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
EXECUTOR_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,63}$")
SEMVER_RE: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$"
)
MAX_CAPABILITIES_BYTES: Final = 16 * 1024
_CAP_KEYS: Final = frozenset({"executors", "operatingSystem", "runtimes", "labels", "capacity", "features"})


def validate_worker_id(value: object) -> str:
    if not isinstance(value, str) or not WORKER_ID_RE.fullmatch(value):
        raise ValidationFailed("invalid worker id", field="worker_id")
    return value


def _clean(value: object, what: str, limit: int) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > limit
        or any(ord(c) < 32 or ord(c) == 127 for c in value)
    ):
        raise ValidationFailed(f"invalid {what}", field=what)
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    executors: tuple[str, ...]
    operating_system: str | None
    runtimes: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    features: tuple[str, ...]

    def to_json(self) -> str:
        body: dict[str, Any] = {"executors": list(self.executors)}
        if self.operating_system is not None:
            body["operatingSystem"] = self.operating_system
        if self.runtimes:
            body["runtimes"] = [{"name": n, "semver": v} for n, v in self.runtimes]
        if self.labels:
            body["labels"] = {k: v for k, v in self.labels}
        if self.features:
            body["features"] = list(self.features)
        return canonical_json(body)

    def digest(self) -> str:
        return sha256_hex(self.to_json())

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


def parse_capabilities(raw: Mapping[str, Any]) -> Capabilities:
    """Strict shape: unknown keys, control characters, duplicates and oversize are all refused."""
    if not isinstance(raw, Mapping) or set(raw) - _CAP_KEYS:
        raise ValidationFailed("unknown capability fields", field="capabilities")
    executors = raw.get("executors")
    if not isinstance(executors, list) or not 1 <= len(executors) <= 16:
        raise ValidationFailed("executors must list 1-16 executor types", field="executors")
    for ex in executors:
        if not isinstance(ex, str) or not EXECUTOR_RE.fullmatch(ex):
            raise ValidationFailed("invalid executor type", field="executors")
    if len(set(executors)) != len(executors):
        raise ValidationFailed("duplicate executor type", field="executors")
    os_name = raw.get("operatingSystem")
    if os_name is not None:
        os_name = _clean(os_name, "operatingSystem", 64)
    runtimes: list[tuple[str, str]] = []
    raw_runtimes = raw.get("runtimes", [])
    if not isinstance(raw_runtimes, list) or len(raw_runtimes) > 32:
        raise ValidationFailed("invalid runtimes", field="runtimes")
    for entry in raw_runtimes:
        if not isinstance(entry, Mapping) or set(entry) != {"name", "semver"}:
            raise ValidationFailed("invalid runtime", field="runtimes")
        semver = _clean(entry["semver"], "semver", 64)
        if not SEMVER_RE.fullmatch(semver):
            raise ValidationFailed("invalid semver", field="runtimes")
        runtimes.append((_clean(entry["name"], "runtime", 64), semver))
    if len({n for n, _ in runtimes}) != len(runtimes):
        raise ValidationFailed("duplicate runtime", field="runtimes")
    raw_labels = raw.get("labels", {})
    if not isinstance(raw_labels, Mapping) or len(raw_labels) > 32:
        raise ValidationFailed("invalid labels", field="labels")
    labels = [(_clean(k, "label key", 128), _clean(v, "label value", 256)) for k, v in raw_labels.items()]
    raw_features = raw.get("features", [])
    if not isinstance(raw_features, list) or len(raw_features) > 32:
        raise ValidationFailed("invalid features", field="features")
    features = [_clean(f, "feature", 64) for f in raw_features]
    if len(set(features)) != len(features):
        raise ValidationFailed("duplicate feature", field="features")
    caps = Capabilities(
        executors=tuple(sorted(executors)),
        operating_system=os_name,
        runtimes=tuple(sorted(runtimes)),
        labels=tuple(sorted(labels)),
        features=tuple(sorted(features)),
    )
    if len(caps.to_json().encode()) > MAX_CAPABILITIES_BYTES:
        raise ValidationFailed("capabilities are too large", field="capabilities")
    return caps


@lru_cache(maxsize=256)
def stored_capabilities(text: str) -> Capabilities:
    """``parse_capabilities`` of a stored capabilities JSON text, remembered per text.

    The dispatcher reads every eligible worker's row on every cycle, and a worker's text changes only
    when it registers again: the same text always parses to the same (immutable) value, so each one
    is parsed and checked once. Invalid text raises every time (exceptions are not remembered).
    """
    return parse_capabilities(json.loads(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """The effective placement of one candidate: required labels/executor plus weighted preferences."""

    executor: str
    required_labels: tuple[tuple[str, str], ...]
    preferred: tuple[Preference, ...]


def effective_placement(executor: str, require: Mapping[str, str], prefer: Sequence[Preference]) -> Placement:
    """The candidate's executor type is always required; a conflicting ``executor`` label rejects."""
    labels = dict(require)
    if labels.get("executor", executor) != executor:
        raise ValidationFailed("placement conflicts with the candidate executor", field="require")
    labels.pop("executor", None)
    return Placement(
        executor=executor, required_labels=tuple(sorted(labels.items())), preferred=tuple(prefer)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSnapshot:
    worker_id: str
    session_id: str
    generation: int
    capabilities: Capabilities
    free_slots: int


def capability_mismatch(placement: Placement, capabilities: Capabilities) -> str | None:
    """None when the capabilities meet the placement's requirements, else ``executor`` or ``label``."""
    if placement.executor not in capabilities.executors:
        return "executor"
    labels = capabilities.label_map
    for key, value in placement.required_labels:
        if labels.get(key) != value:
            return "label"
    return None


def mismatch(placement: Placement, worker: WorkerSnapshot) -> str | None:
    """None when eligible, else a low-cardinality reason."""
    if worker.free_slots < 1:
        return "worker_unavailable"
    return capability_mismatch(placement, worker.capabilities)


def score(placement: Placement, worker: WorkerSnapshot) -> int:
    labels = worker.capabilities.label_map
    return sum(p.weight for p in placement.preferred if all(labels.get(k) == v for k, v in p.labels.items()))


def rank(placement: Placement, workers: Sequence[WorkerSnapshot]) -> list[tuple[WorkerSnapshot, int]]:
    """Eligible workers ordered by score DESC, free slots DESC, worker id ASC."""
    eligible = [(w, score(placement, w)) for w in workers if mismatch(placement, w) is None]
    eligible.sort(key=lambda ws: (-ws[1], -ws[0].free_slots, ws[0].worker_id))
    return eligible


WaitingReason = Literal["no_matching_worker", "no_free_slot", "worker_draining", "no_worker", "queued"]
WAITING_REASONS: Final[tuple[WaitingReason, ...]] = (
    "no_matching_worker",
    "no_free_slot",
    "worker_draining",
    "no_worker",
    "queued",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetWorker:
    """A registered worker with a live session, as the waiting reason sees it."""

    status: Literal["online", "draining"]
    capabilities: Capabilities
    free_slots: int


def waiting_reason(placement: Placement | None, fleet: Sequence[FleetWorker]) -> WaitingReason:
    """Why a queued run with this placement is not running yet (low cardinality, no ids or labels).

    ``placement`` None means the task's placement cannot be satisfied by any worker at all (it
    conflicts with its executor). ``queued``: a matching online worker has a free slot, so the run
    only waits for its turn in the queue.
    """
    if not fleet:
        return "no_worker"
    if placement is None:
        return "no_matching_worker"
    matching = [w for w in fleet if capability_mismatch(placement, w.capabilities) is None]
    if not matching:
        return "no_matching_worker"
    online = [w for w in matching if w.status == "online"]
    if not online:
        return "worker_draining"
    if all(w.free_slots < 1 for w in online):
        return "no_free_slot"
    return "queued"
