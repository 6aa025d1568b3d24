"""The journal's bounds and the checks every input passes before a transaction opens."""

from __future__ import annotations

import json
import re
from typing import Final

from ql3.domain.journal import (
    DELIVERY_KINDS,
    RECOVERY_REASONS,
    REQUIRED_FIELDS,
    STATES,
    TERMINAL_STATES,
    JournalInvalid,
    JournalOffer,
)

DEFAULT_CAPACITY: Final = 64
MAX_CAPACITY: Final = 1024
MAX_PAGE_LIMIT: Final = 64
DEFAULT_AUDIT_PAGE_SIZE: Final = 16
DEFAULT_AUDIT_MAX_PAGES: Final = 4
MAX_AUDIT_PAGES: Final = 16
DEFAULT_RETENTION_LIMIT: Final = 8
MAX_RETENTION_LIMIT: Final = 64
MIN_RETENTION_AGE_MS: Final = 60_000
MAX_RETENTION_AGE_MS: Final = 30 * 86_400_000
MAX_OFFER_JSON_BYTES: Final = 192 * 1024
MAX_LEASE_TOKEN_BYTES: Final = 1024
# The journal indexes every row's keys in memory up to this many rows (store.WorkerJournal._keys).
KEY_INDEX_LIMIT: Final = 4 * MAX_CAPACITY

_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
_DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")
HANDLE_RE: Final = re.compile(r"[\x21-\x7e]{1,512}")
MAX_INT64: Final = 2**63 - 1


def validate_offer(offer: JournalOffer) -> None:
    if not all(is_id(value) for value in (offer.offer_id, offer.run_id, offer.attempt_id)):
        raise JournalInvalid(reason="id_invalid")
    check_int(offer.lease_generation, 0, MAX_INT64, "lease_generation_invalid")
    if not is_digest(offer.execution_spec_digest):
        raise JournalInvalid(reason="spec_digest_invalid")
    if offer.delivery_kind not in DELIVERY_KINDS:
        raise JournalInvalid(reason="delivery_kind_invalid")
    if offer.lease_token is not None and (
        not isinstance(offer.lease_token, str)
        or not 0 < len(offer.lease_token.encode()) <= MAX_LEASE_TOKEN_BYTES
    ):
        raise JournalInvalid(reason="lease_token_invalid")
    if not isinstance(offer.offer_json, str) or len(offer.offer_json.encode()) > MAX_OFFER_JSON_BYTES:
        raise JournalInvalid(reason="offer_invalid")
    try:
        parsed = json.loads(offer.offer_json)
    except ValueError:
        raise JournalInvalid(reason="offer_invalid") from None
    if not isinstance(parsed, dict):
        raise JournalInvalid(reason="offer_invalid")


def is_id(value: object) -> bool:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


def check_int(value: object, low: int, high: int, reason: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise JournalInvalid(reason=reason)


def check_budget(page_size: int, max_pages: int) -> None:
    check_int(page_size, 1, MAX_PAGE_LIMIT, "page_size_out_of_range")
    check_int(max_pages, 1, MAX_AUDIT_PAGES, "max_pages_out_of_range")


def is_handle(value: object) -> bool:
    return isinstance(value, str) and HANDLE_RE.fullmatch(value) is not None


def check_step(
    to_state: str,
    expected_revision: int,
    *,
    completion_callback_sequence: int | None,
    completion_token_digest: str | None,
    log_artifact_id: str | None,
    executor_handle: str | None,
    executor_started_at_ms: int | None,
    recovery_reason: str | None,
) -> None:
    """The fields of one ``advance``: exactly those its target state requires, each well formed."""
    if to_state not in STATES:
        raise JournalInvalid(reason="unknown_state")
    check_int(expected_revision, 1, MAX_INT64, "revision_invalid")
    given = {
        name
        for name, value in (
            ("completion_callback_sequence", completion_callback_sequence),
            ("completion_token_digest", completion_token_digest),
            ("log_artifact_id", log_artifact_id),
            ("executor_handle", executor_handle),
            ("executor_started_at_ms", executor_started_at_ms),
            ("recovery_reason", recovery_reason),
        )
        if value is not None
    }
    required = REQUIRED_FIELDS.get(to_state, frozenset())
    if given - required:
        raise JournalInvalid(reason="field_not_allowed")
    if required - given:
        raise JournalInvalid(reason="field_missing")
    if completion_callback_sequence is not None:
        check_int(completion_callback_sequence, 0, MAX_INT64, "callback_sequence_invalid")
    if completion_token_digest is not None and not is_digest(completion_token_digest):
        raise JournalInvalid(reason="token_digest_invalid")
    if log_artifact_id is not None and not is_id(log_artifact_id):
        raise JournalInvalid(reason="log_artifact_id_invalid")
    if executor_handle is not None and not is_handle(executor_handle):
        raise JournalInvalid(reason="executor_handle_invalid")
    if executor_started_at_ms is not None:
        check_int(executor_started_at_ms, 0, MAX_INT64, "executor_started_at_invalid")
    if recovery_reason is not None and recovery_reason not in RECOVERY_REASONS:
        raise JournalInvalid(reason="recovery_reason_invalid")


def check_via(via: str | None, to_state: str, *, prune: bool) -> None:
    """``advance``'s shortcuts: a ``via`` state that takes no fields; ``prune`` only into a settled state."""
    if via is not None and (via not in STATES or via in REQUIRED_FIELDS):
        raise JournalInvalid(reason="via_invalid")
    if type(prune) is not bool or (prune and to_state not in TERMINAL_STATES):
        raise JournalInvalid(reason="prune_not_settled")
