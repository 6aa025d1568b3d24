"""Pure cancellation rules: result classes, capped backoff, strict blocked cursor, summary assessment."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from ql3.domain import cancellation as rules
from ql3.domain.cancellation import BlockedCursor, CancellationDispatch
from ql3.domain.digests import domain_digest
from ql3.domain.errors import ValidationFailed

RUN_ID = "01a00000-0000-7000-8000-000000000000"


@pytest.mark.parametrize(
    ("result", "klass", "status", "event"),
    [
        ("controller_missing", "retryable", "retry_wait", "run.cancel_dispatch_failed"),
        ("handle_missing", "retryable", "retry_wait", "run.cancel_dispatch_failed"),
        ("dispatch_error", "retryable", "retry_wait", "run.cancel_dispatch_failed"),
        ("identity_mismatch", "blocking", "blocked", "run.cancel_dispatch_blocked"),
        ("pid_mismatch", "blocking", "blocked", "run.cancel_dispatch_blocked"),
        ("unsupported", "blocking", "blocked", "run.cancel_dispatch_blocked"),
        ("invalid", "blocking", "blocked", "run.cancel_dispatch_blocked"),
        ("termination_requested", "done", "dispatched", "run.cancel_dispatched"),
        ("already_exited", "done", "dispatched", "run.cancel_dispatched"),
    ],
)
def test_every_result_has_one_class_status_and_event(
    result: str, klass: str, status: str, event: str
) -> None:
    assert rules.classify_result(result) == klass
    assert rules.status_after(result) == status
    assert rules.event_type_for(result) == event


def test_an_unknown_result_is_never_guessed() -> None:
    with pytest.raises(ValidationFailed):
        rules.classify_result("terminated_probably")


@pytest.mark.parametrize(
    ("status", "result"),
    [
        ("termination_requested", "termination_requested"),
        ("already_exited", "already_exited"),
        ("identity_mismatch", "identity_mismatch"),
        ("pid_mismatch", "pid_mismatch"),
        ("unsupported", "unsupported"),
        ("invalid", "invalid"),
        ("something_new", "dispatch_error"),
        ("handle_missing", "dispatch_error"),
        (None, "dispatch_error"),
        (7, "dispatch_error"),
    ],
)
def test_controller_statuses_map_to_results(status: object, result: str) -> None:
    assert rules.result_from_stop_status(status) == result


def test_backoff_doubles_from_the_base_and_is_capped() -> None:
    delays = [rules.backoff_ms(n, 1_000, 60_000) for n in range(1, 10)]

    assert delays == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]
    # the exponent is capped at 30, so even an absurd count is cheap and lands on the cap
    assert rules.backoff_ms(10**12, 1, 86_400_000) == 86_400_000
    assert rules.backoff_ms(27, 1, 86_400_000) == 2**26


@pytest.mark.parametrize(
    ("count", "base", "cap"), [(0, 1_000, 60_000), (1, 0, 60_000), (1, 2, 1), (1, 1, 86_400_001)]
)
def test_backoff_inputs_are_bounded(count: int, base: int, cap: int) -> None:
    with pytest.raises(ValidationFailed):
        rules.backoff_ms(count, base, cap)


def test_the_lease_digest_is_domain_separated() -> None:
    token = "t" * 43
    assert rules.lease_token_digest(token) == domain_digest("qinglong.cancellation-dispatch-lease.v1", token)
    assert rules.lease_token_digest(token) != domain_digest("ql3.run-lease.v1", token)
    assert len(rules.lease_token_digest(token)) == 64


def test_limits_on_leases_owners_tokens_and_rearm_delays() -> None:
    assert rules.validate_lease_ms(5_000) == 5_000 and rules.validate_lease_ms(300_000) == 300_000
    for bad in (4_999, 300_001, True):
        with pytest.raises(ValidationFailed):
            rules.validate_lease_ms(bad)
    for bad_owner in ("", " x", "x" * 129, "a\nb"):
        with pytest.raises(ValidationFailed):
            rules.validate_owner(bad_owner)
    for bad_token in ("a" * 31, "a" * 129, "a" * 40 + "="):
        with pytest.raises(ValidationFailed):
            rules.validate_token(bad_token)
    assert rules.validate_rearm_delay(1_000) == 1_000 and rules.validate_rearm_delay(86_400_000) == 86_400_000
    for bad_delay in (999, 86_400_001):
        with pytest.raises(ValidationFailed):
            rules.validate_rearm_delay(bad_delay)


def _cursor_text(obj: object) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return "v1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_the_blocked_cursor_round_trips_in_its_canonical_form() -> None:
    cursor = BlockedCursor(snapshot_at_ms=1_800_000_000_500, blocked_at_ms=1_800_000_000_000, run_id=RUN_ID)

    text = rules.encode_blocked_cursor(cursor)

    assert text == _cursor_text(
        {"snapshotAtMs": 1_800_000_000_500, "blockedAtMs": 1_800_000_000_000, "runId": RUN_ID}
    )
    assert "=" not in text and rules.decode_blocked_cursor(text) == cursor


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "v1",
        "v1.",
        "V1." + _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": RUN_ID})[3:],
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": RUN_ID}) + "=",
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": RUN_ID})[:-1] + "+",
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1}),
        _cursor_text({"runId": RUN_ID, "snapshotAtMs": 2, "blockedAtMs": 1}),
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": RUN_ID, "extra": 0}),
        _cursor_text({"snapshotAtMs": 1, "blockedAtMs": 2, "runId": RUN_ID}),
        _cursor_text({"snapshotAtMs": 2.0, "blockedAtMs": 1, "runId": RUN_ID}),
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": False, "runId": RUN_ID}),
        _cursor_text({"snapshotAtMs": 2**53, "blockedAtMs": 1, "runId": RUN_ID}),
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": RUN_ID.upper()}),
        _cursor_text({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": 5}),
        _cursor_text([2, 1, RUN_ID]),
        "v1." + base64.urlsafe_b64encode(b'{"snapshotAtMs": 2, "blockedAtMs": 1, "runId": "x"}').decode(),
        "v1." + base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("="),
        "v1." + "A" * 300,
    ],
)
def test_a_malformed_blocked_cursor_is_rejected(text: object) -> None:
    with pytest.raises(ValidationFailed):
        rules.decode_blocked_cursor(text)


def test_a_non_canonical_encoding_of_a_valid_cursor_is_rejected() -> None:
    spaced = "v1." + base64.urlsafe_b64encode(
        json.dumps({"snapshotAtMs": 2, "blockedAtMs": 1, "runId": RUN_ID}).encode()
    ).decode().rstrip("=")

    with pytest.raises(ValidationFailed):
        rules.decode_blocked_cursor(spaced)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"pending": 0, "leased": 0, "retry_wait": 0, "blocked": 0}, ("clear", "none")),
        ({"pending": 1, "leased": 0, "retry_wait": 0, "blocked": 0}, ("converging", "wait")),
        ({"pending": 0, "leased": 1, "retry_wait": 0, "blocked": 0}, ("converging", "wait")),
        ({"pending": 0, "leased": 0, "retry_wait": 1, "blocked": 0}, ("converging", "wait")),
        ({"pending": 3, "leased": 1, "retry_wait": 1, "blocked": 1}, ("attention_required", "inspect")),
    ],
)
def test_assessment_is_three_state(counts: dict[str, int], expected: tuple[str, str]) -> None:
    assert rules.assess(**counts) == expected


def test_build_summary_reconciles_and_refuses_inconsistent_counts() -> None:
    summary = rules.build_summary(
        observed_at_ms=100,
        by_status={"pending": 1, "leased": 2, "retry_wait": 1, "dispatched": 4, "blocked": 2},
        blocked_by_result={"identity_mismatch": 1, "invalid": 1},
        due=2,
        expired_lease=1,
        oldest_blocked_at_ms=90,
    )
    assert summary["dispatches"]["total"] == 10 and summary["oldestBlockedAtMs"] == 90
    assert summary["blockingResults"] == {
        "identityMismatch": 1,
        "pidMismatch": 0,
        "unsupported": 0,
        "invalid": 1,
    }
    assert (summary["assessment"], summary["operatorAction"]) == ("attention_required", "inspect")

    good: dict[str, Any] = {
        "observed_at_ms": 100,
        "by_status": {"leased": 1, "blocked": 1},
        "blocked_by_result": {"pid_mismatch": 1},
        "due": 0,
        "expired_lease": 1,
        "oldest_blocked_at_ms": 50,
    }
    rules.build_summary(**good)
    broken: dict[str, Any]
    for broken in (
        {"blocked_by_result": {}},
        {"blocked_by_result": {"handle_missing": 1}},
        {"due": 1},
        {"expired_lease": 2},
        {"oldest_blocked_at_ms": None},
        {"oldest_blocked_at_ms": 101},
        {"by_status": {"leased": 1, "blocked": 1, "exploded": 1}},
    ):
        with pytest.raises(rules.SummaryInvariantViolated):
            rules.build_summary(**(good | broken))


def _row(**kw: object) -> CancellationDispatch:
    base = CancellationDispatch(
        run_id=RUN_ID,
        attempt_id=RUN_ID,
        project_id="p",
        status="pending",
        version=0,
        dispatch_count=0,
        next_attempt_at_ms=1,
        lease_owner=None,
        lease_token_digest=None,
        lease_expires_at_ms=None,
        last_result=None,
        last_dispatched_at_ms=None,
        created_at_ms=1,
        updated_at_ms=1,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_row_shape_invariants_mirror_the_migration_checks() -> None:
    leased = {
        "status": "leased",
        "version": 1,
        "dispatch_count": 1,
        "next_attempt_at_ms": None,
        "lease_owner": "o",
        "lease_token_digest": "d" * 64,
        "lease_expires_at_ms": 5,
    }
    assert rules.shape_violations(_row()) == []
    assert rules.shape_violations(_row(**leased)) == []
    assert rules.shape_violations(_row(**leased | {"lease_owner": None})) == ["lease_fields"]
    assert "next_attempt_at" in rules.shape_violations(_row(next_attempt_at_ms=None))
    assert "pending_shape" in rules.shape_violations(_row(version=1))
    assert "version_below_count" in rules.shape_violations(_row(**leased | {"version": 0}))
    settled = {"next_attempt_at_ms": None, "version": 2, "dispatch_count": 1}
    assert rules.shape_violations(_row(status="dispatched", last_result="already_exited", **settled)) == []
    assert "dispatched_result" in rules.shape_violations(
        _row(status="dispatched", last_result="invalid", **settled)
    )
    assert "blocked_result" in rules.shape_violations(
        _row(status="blocked", last_result="handle_missing", **settled)
    )
    rearmed = {"version": 3, "dispatch_count": 1, "next_attempt_at_ms": 9}
    assert rules.shape_violations(_row(status="retry_wait", last_result="pid_mismatch", **rearmed)) == []
    assert "retry_wait_result" in rules.shape_violations(
        _row(status="retry_wait", last_result="already_exited", **rearmed)
    )
