"""Durable cancellation dispatch rules (docs/contracts.md §1.6, §4, §9): pure, no I/O, no clock."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ql3.domain import leases as lease_rules
from ql3.domain.digests import CANCEL_LEASE_DOMAIN, domain_digest
from ql3.domain.errors import Ql3Error, ValidationFailed
from ql3.domain.ids import is_id

DispatchStatus = Literal["pending", "leased", "retry_wait", "dispatched", "blocked"]
ResultClass = Literal["retryable", "blocking", "done"]
DISPATCH_STATUSES: Final[tuple[DispatchStatus, ...]] = (
    "pending",
    "leased",
    "retry_wait",
    "dispatched",
    "blocked",
)

RETRYABLE_RESULTS: Final = frozenset({"controller_missing", "handle_missing", "dispatch_error"})
BLOCKING_RESULTS: Final = frozenset({"identity_mismatch", "pid_mismatch", "unsupported", "invalid"})
DONE_RESULTS: Final = frozenset({"termination_requested", "already_exited"})
ALL_RESULTS: Final = RETRYABLE_RESULTS | BLOCKING_RESULTS | DONE_RESULTS
CANCEL_REASONS: Final = frozenset({"user", "policy", "shutdown", "reconcile", "timeout"})

# The status a result moves the dispatch to, and the event that records it.
_STATUS_BY_CLASS: Final[dict[ResultClass, DispatchStatus]] = {
    "retryable": "retry_wait",
    "blocking": "blocked",
    "done": "dispatched",
}
_EVENT_BY_CLASS: Final[dict[ResultClass, str]] = {
    "retryable": "run.cancel_dispatch_failed",
    "blocking": "run.cancel_dispatch_blocked",
    "done": "run.cancel_dispatched",
}

# Limits (docs/contracts.md §7).
DEFAULT_LEASE_MS: Final = 30_000
DEFAULT_RETRY_BASE_MS: Final = 1_000
DEFAULT_RETRY_MAX_MS: Final = 60_000
MAX_RETRY_MS: Final = 86_400_000
MAX_BACKOFF_EXPONENT: Final = 30
DEFAULT_PAGE: Final = 32
DEFAULT_PAGES: Final = 4
MAX_PAGE: Final = 64
MAX_PAGES: Final = 64
MIN_REARM_DELAY_MS: Final = 1_000
MAX_REARM_DELAY_MS: Final = 86_400_000
BLOCKED_PAGE: Final = 16
MAX_OWNER_CHARS: Final = 128
MAX_MUTATION_ID_CHARS: Final = 128
DEFAULT_GRACE_MS: Final = 5_000
MAX_GRACE_MS: Final = 60_000

_TOKEN_RE: Final = re.compile(r"^[A-Za-z0-9_-]{32,128}$")
_OWNER_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")
MUTATION_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_MUTATION_RE: Final = re.compile(MUTATION_ID_PATTERN)
_B64URL_RE: Final = re.compile(r"^[A-Za-z0-9_-]+$")
_CURSOR_PREFIX: Final = "v1."
_MAX_CURSOR_CHARS: Final = 256
_MAX_SAFE_INT: Final = 2**53 - 1


def classify_result(result: str) -> ResultClass:
    """retryable / blocking / done; an unknown result is a validation error, never a guess."""
    if result in RETRYABLE_RESULTS:
        return "retryable"
    if result in BLOCKING_RESULTS:
        return "blocking"
    if result in DONE_RESULTS:
        return "done"
    raise ValidationFailed("unknown cancellation dispatch result", field="result")


def status_after(result: str) -> DispatchStatus:
    return _STATUS_BY_CLASS[classify_result(result)]


def event_type_for(result: str) -> str:
    return _EVENT_BY_CLASS[classify_result(result)]


def result_from_stop_status(status: object) -> str:
    """Map a controller StopOutcome status; anything unrecognised is a transient ``dispatch_error``."""
    if isinstance(status, str) and (status in DONE_RESULTS or status in BLOCKING_RESULTS):
        return status
    return "dispatch_error"


def validate_retry_budget(base_ms: int, max_ms: int) -> None:
    if not 1 <= base_ms <= max_ms <= MAX_RETRY_MS:
        raise ValidationFailed("retry backoff out of range", field="retry")


def backoff_ms(dispatch_count: int, base_ms: int, max_ms: int) -> int:
    """``min(max, base * 2^min(count-1, 30))`` for the ``dispatch_count``-th failed dispatch (count >= 1)."""
    validate_retry_budget(base_ms, max_ms)
    if dispatch_count < 1:
        raise ValidationFailed("dispatch count must be at least 1", field="dispatch_count")
    return min(max_ms, base_ms * (1 << min(dispatch_count - 1, MAX_BACKOFF_EXPONENT)))


def validate_lease_ms(lease_ms: object) -> int:
    return lease_rules.CANCELLATION.validate(lease_ms)


def validate_owner(owner: str) -> str:
    if not isinstance(owner, str) or not _OWNER_RE.fullmatch(owner):
        raise ValidationFailed("invalid cancellation lease owner", field="owner")
    return owner


def validate_token(token: str) -> str:
    if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
        raise ValidationFailed("invalid cancellation lease token", field="token")
    return token


def validate_reason(reason: str) -> str:
    if reason not in CANCEL_REASONS:
        raise ValidationFailed("invalid cancel reason", field="reason")
    return reason


def validate_mutation_id(mutation_id: str) -> str:
    if not isinstance(mutation_id, str) or not _MUTATION_RE.fullmatch(mutation_id):
        raise ValidationFailed("invalid mutation id", field="mutationId")
    return mutation_id


def validate_rearm_delay(delay_ms: int) -> int:
    if (
        isinstance(delay_ms, bool)
        or not isinstance(delay_ms, int)
        or not MIN_REARM_DELAY_MS <= delay_ms <= MAX_REARM_DELAY_MS
    ):
        raise ValidationFailed("retry delay out of range", field="retryDelayMs")
    return delay_ms


def lease_token_digest(token: str) -> str:
    """``sha256(CANCEL_LEASE_DOMAIN || 0x00 || token)``; the raw token is never stored."""
    return domain_digest(CANCEL_LEASE_DOMAIN, token)


def dedupe_key(attempt_id: str, dispatch_count: int) -> str:
    return f"cancel-dispatch:{attempt_id}:{dispatch_count}"


def rearm_dedupe_key(mutation_id: str) -> str:
    return f"cancel-rearm:{mutation_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CancellationDispatch:
    """The claim/backoff index of one Run's cancellation; events are the history."""

    run_id: str
    attempt_id: str
    project_id: str
    status: DispatchStatus
    version: int
    dispatch_count: int
    next_attempt_at_ms: int | None
    lease_owner: str | None
    lease_token_digest: str | None
    lease_expires_at_ms: int | None
    last_result: str | None
    last_dispatched_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int


def shape_violations(d: CancellationDispatch) -> list[str]:
    """The row invariants of docs/contracts.md §1.6 (the migration's CHECKs enforce the same on both
    databases)."""
    out: list[str] = []
    lease_fields = (d.lease_owner, d.lease_token_digest, d.lease_expires_at_ms)
    if (d.status == "leased") != all(f is not None for f in lease_fields) or (
        d.status != "leased" and any(f is not None for f in lease_fields)
    ):
        out.append("lease_fields")
    if (d.status in ("pending", "retry_wait")) != (d.next_attempt_at_ms is not None):
        out.append("next_attempt_at")
    if d.status == "pending":
        if d.version != 0 or d.dispatch_count != 0 or d.last_result is not None:
            out.append("pending_shape")
    elif d.dispatch_count < 1:
        out.append("count")
    if d.version < d.dispatch_count:
        out.append("version_below_count")
    if d.status == "dispatched" and d.last_result not in DONE_RESULTS:
        out.append("dispatched_result")
    if d.status == "blocked" and d.last_result not in BLOCKING_RESULTS:
        out.append("blocked_result")
    if d.status == "retry_wait" and d.last_result not in RETRYABLE_RESULTS | BLOCKING_RESULTS:
        out.append("retry_wait_result")
    if d.status == "leased" and d.last_result is not None and d.last_result in DONE_RESULTS:
        out.append("leased_result")
    return out


# -- blocked drill-down cursor ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedCursor:
    snapshot_at_ms: int
    blocked_at_ms: int
    run_id: str


def encode_blocked_cursor(cursor: BlockedCursor) -> str:
    body = json.dumps(
        {"snapshotAtMs": cursor.snapshot_at_ms, "blockedAtMs": cursor.blocked_at_ms, "runId": cursor.run_id},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def _cursor_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SAFE_INT:
        raise ValueError("bad integer")
    return value


def decode_blocked_cursor(text: object) -> BlockedCursor:
    """Strict: the exact ``v1.`` + unpadded base64url of the canonical JSON, or ValidationFailed."""
    try:
        if not isinstance(text, str) or len(text) > _MAX_CURSOR_CHARS or not text.startswith(_CURSOR_PREFIX):
            raise ValueError("bad prefix")
        encoded = text[len(_CURSOR_PREFIX) :]
        if not _B64URL_RE.fullmatch(encoded):
            raise ValueError("bad alphabet")
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        value = json.loads(raw.decode("utf-8"))
        if not isinstance(value, dict) or list(value) != ["snapshotAtMs", "blockedAtMs", "runId"]:
            raise ValueError("bad shape")
        run_id = value["runId"]
        if not isinstance(run_id, str) or not is_id(run_id):
            raise ValueError("bad run id")
        cursor = BlockedCursor(
            snapshot_at_ms=_cursor_int(value["snapshotAtMs"]),
            blocked_at_ms=_cursor_int(value["blockedAtMs"]),
            run_id=run_id,
        )
        if cursor.blocked_at_ms > cursor.snapshot_at_ms:
            raise ValueError("blocked after snapshot")
        if encode_blocked_cursor(cursor) != text:
            raise ValueError("not canonical")
        return cursor
    except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
        raise ValidationFailed("invalid cursor", field="cursor") from exc


# -- project summary --------------------------------------------------------------------------------


class SummaryInvariantViolated(Ql3Error):
    """The cancellation summary failed its own consistency checks."""

    code = "summary_invariant_violated"


_STATUS_KEYS: Final = (
    ("pending", "pending"),
    ("leased", "leased"),
    ("retry_wait", "retryWait"),
    ("dispatched", "dispatched"),
    ("blocked", "blocked"),
)
_BLOCKING_KEYS: Final = (
    ("identity_mismatch", "identityMismatch"),
    ("pid_mismatch", "pidMismatch"),
    ("unsupported", "unsupported"),
    ("invalid", "invalid"),
)


def assess(*, pending: int, leased: int, retry_wait: int, blocked: int) -> tuple[str, str]:
    """blocked -> attention_required/inspect; anything in flight -> converging/wait; else clear/none."""
    if blocked > 0:
        return "attention_required", "inspect"
    if pending or leased or retry_wait:
        return "converging", "wait"
    return "clear", "none"


def build_summary(
    *,
    observed_at_ms: int,
    by_status: Mapping[str, int],
    blocked_by_result: Mapping[str, int],
    due: int,
    expired_lease: int,
    oldest_blocked_at_ms: int | None,
) -> dict[str, Any]:
    """The low-sensitivity summary; raises SummaryInvariantViolated rather than report inconsistent counts."""
    dispatches: dict[str, int] = {"total": 0}
    for status, key in _STATUS_KEYS:
        dispatches[key] = int(by_status.get(status, 0))
    dispatches["total"] = sum(dispatches[key] for _, key in _STATUS_KEYS)
    blocking = {key: int(blocked_by_result.get(result, 0)) for result, key in _BLOCKING_KEYS}
    unknown = set(by_status) - {s for s, _ in _STATUS_KEYS}
    unknown_results = set(blocked_by_result) - BLOCKING_RESULTS
    assessment, action = assess(
        pending=dispatches["pending"],
        leased=dispatches["leased"],
        retry_wait=dispatches["retryWait"],
        blocked=dispatches["blocked"],
    )
    summary: dict[str, Any] = {
        "observedAtMs": observed_at_ms,
        "dispatches": dispatches,
        "signals": {"due": int(due), "expiredLease": int(expired_lease)},
        "blockingResults": blocking,
    }
    if dispatches["blocked"] > 0 and oldest_blocked_at_ms is not None:
        summary["oldestBlockedAtMs"] = int(oldest_blocked_at_ms)
    summary["assessment"] = assessment
    summary["operatorAction"] = action
    violated = (
        unknown
        or unknown_results
        or any(v < 0 for v in dispatches.values())
        or any(v < 0 for v in blocking.values())
        or sum(blocking.values()) != dispatches["blocked"]
        or not 0 <= due <= dispatches["pending"] + dispatches["retryWait"]
        or not 0 <= expired_lease <= dispatches["leased"]
        or ((dispatches["blocked"] > 0) != ("oldestBlockedAtMs" in summary))
        or summary.get("oldestBlockedAtMs", observed_at_ms) > observed_at_ms
    )
    if violated:
        raise SummaryInvariantViolated()
    return summary
