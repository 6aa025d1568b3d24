"""The journal state machine: one step at a time, CAS on the revision, required fields per state."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from ql3.domain.journal import JournalConflict, JournalInvalid, JournalState, RecoveryReason
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import (
    SPEC_DIGEST,
    START_MS,
    STEP_FIELDS,
    Clock,
    make_offer,
    walk,
)

PATH_TO: dict[str, tuple[JournalState, ...]] = {
    "accepted": (),
    "starting_acknowledged": ("starting_acknowledged",),
    "launching": ("starting_acknowledged", "launching"),
    "started": ("starting_acknowledged", "launching", "started"),
    "running_acknowledged": ("starting_acknowledged", "launching", "started", "running_acknowledged"),
}
LEASE_LOST: list[RecoveryReason] = [
    "lease_lost_local_execution_stopped",
    "lease_lost_local_execution_unverified",
]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal(tmp_path: Path, clock: Clock) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(tmp_path / "worker.db", clock=clock) as opened:
        opened.accept(make_offer())
        yield opened


def test_the_main_path_advances_one_revision_per_step(journal: WorkerJournal, clock: Clock) -> None:
    # Given an accepted offer at revision 1
    record = journal.get("offer-1")
    assert record is not None and record.revision == 1
    seen: list[tuple[str, int, int]] = []

    # When it walks the main path, the clock moving between steps
    for state in (
        "starting_acknowledged",
        "launching",
        "started",
        "running_acknowledged",
        "completion_acknowledged",
    ):
        clock.now += 1_000
        record = journal.advance(
            "offer-1", expected_revision=record.revision, to_state=state, **STEP_FIELDS.get(state, {})
        )
        seen.append((record.state, record.revision, record.updated_at_ms))

    # Then every step is one revision and the facts written on the way are kept
    assert seen == [
        ("starting_acknowledged", 2, START_MS + 1_000),
        ("launching", 3, START_MS + 2_000),
        ("started", 4, START_MS + 3_000),
        ("running_acknowledged", 5, START_MS + 4_000),
        ("completion_acknowledged", 6, START_MS + 5_000),
    ]
    assert record.completion_acknowledged_at_ms == START_MS + 5_000
    assert record.accepted_at_ms == START_MS
    assert record.completion_callback_sequence == 1
    assert record.completion_token_digest == STEP_FIELDS["launching"]["completion_token_digest"]
    assert record.log_artifact_id == "log-1"
    assert record.executor_handle == "ql3lp1.eyJ2IjoxfQ"
    assert record.executor_started_at_ms == START_MS
    assert record.recovery_reason is None
    assert journal.get("offer-1") == record


@pytest.mark.parametrize(
    "before", [(), ("starting_acknowledged",)], ids=["accepted", "starting_acknowledged"]
)
def test_an_explicit_start_rejection_ends_in_start_failure_acknowledged(
    journal: WorkerJournal, before: tuple[JournalState, ...]
) -> None:
    record = walk(journal, "offer-1", *before, "start_failed", "start_failure_acknowledged")

    assert record.state == "start_failure_acknowledged"
    assert record.revision == len(before) + 3
    assert record.completion_token_digest is None


def test_an_explicit_executor_rejection_after_launching_ends_in_start_failure_acknowledged(
    journal: WorkerJournal,
) -> None:
    record = walk(journal, "offer-1", *PATH_TO["launching"], "start_failed", "start_failure_acknowledged")

    assert (record.state, record.revision) == ("start_failure_acknowledged", 5)
    assert record.completion_token_digest == STEP_FIELDS["launching"]["completion_token_digest"]


def test_a_receipt_found_before_the_running_ack_completes_a_started_record(
    journal: WorkerJournal, clock: Clock
) -> None:
    # Given a started record whose process finished before its running ACK was written
    started = walk(journal, "offer-1", *PATH_TO["started"])
    clock.now += 1_000

    # When the completion from its receipt is acknowledged
    done = journal.advance("offer-1", expected_revision=started.revision, to_state="completion_acknowledged")

    # Then the record is settled without a running ACK in between
    assert (done.state, done.revision, done.completion_acknowledged_at_ms) == (
        "completion_acknowledged",
        started.revision + 1,
        clock.now,
    )


@pytest.mark.parametrize(
    ("start", "target"),
    [
        ("started", "launching"),
        ("running_acknowledged", "started"),
        ("starting_acknowledged", "accepted"),
        ("launching", "starting_acknowledged"),
    ],
)
def test_a_backward_move_is_rejected_and_changes_nothing(
    journal: WorkerJournal, start: str, target: JournalState
) -> None:
    # Given a record that already moved past the target state
    current = walk(journal, "offer-1", *PATH_TO[start])

    # When it is asked to go back
    with pytest.raises(JournalConflict) as caught:
        journal.advance(
            "offer-1", expected_revision=current.revision, to_state=target, **STEP_FIELDS.get(target, {})
        )

    # Then the move is refused and the record is as it was
    assert caught.value.details["reason"] == "invalid_transition"
    assert journal.get("offer-1") == current


@pytest.mark.parametrize(
    ("start", "target"),
    [
        ("accepted", "launching"),
        ("accepted", "started"),
        ("starting_acknowledged", "started"),
        ("launching", "running_acknowledged"),
        ("launching", "completion_acknowledged"),
        ("starting_acknowledged", "completion_acknowledged"),
        ("started", "start_failed"),
        ("running_acknowledged", "start_failed"),
        ("accepted", "start_failure_acknowledged"),
        ("accepted", "completion_acknowledged"),
    ],
)
def test_a_skipped_state_is_rejected_and_changes_nothing(
    journal: WorkerJournal, start: str, target: JournalState
) -> None:
    current = walk(journal, "offer-1", *PATH_TO[start])

    with pytest.raises(JournalConflict) as caught:
        journal.advance(
            "offer-1", expected_revision=current.revision, to_state=target, **STEP_FIELDS.get(target, {})
        )

    assert caught.value.details["reason"] == "invalid_transition"
    assert journal.get("offer-1") == current


@pytest.mark.parametrize("expected_revision", [1, 3], ids=["stale", "gap"])
def test_a_revision_other_than_the_current_one_is_rejected(
    journal: WorkerJournal, expected_revision: int
) -> None:
    # Given a record at revision 2
    current = walk(journal, "offer-1", "starting_acknowledged")

    # When a writer presents an older or a future revision
    with pytest.raises(JournalConflict) as caught:
        journal.advance(
            "offer-1", expected_revision=expected_revision, to_state="launching", **STEP_FIELDS["launching"]
        )

    # Then the write is refused
    assert caught.value.details["reason"] == "stale_revision"
    assert journal.get("offer-1") == current


def test_only_one_of_two_writers_holding_the_same_revision_wins(journal: WorkerJournal) -> None:
    # Given two writers that both read revision 1
    # When both try to advance from it
    first = journal.advance("offer-1", expected_revision=1, to_state="starting_acknowledged")
    with pytest.raises(JournalConflict):
        journal.advance("offer-1", expected_revision=1, to_state="start_failed")

    # Then the first write stands
    assert journal.get("offer-1") == first


@pytest.mark.parametrize(
    "terminal",
    [
        ("start_failed", "start_failure_acknowledged"),
        ("starting_acknowledged", "launching", "started", "running_acknowledged", "completion_acknowledged"),
    ],
    ids=["start_failure_acknowledged", "completion_acknowledged"],
)
@pytest.mark.parametrize(
    "target", ["recovery_required", "accepted", "start_failed", "completion_acknowledged"]
)
def test_terminal_states_are_final(
    journal: WorkerJournal, terminal: tuple[JournalState, ...], target: JournalState
) -> None:
    current = walk(journal, "offer-1", *terminal)

    with pytest.raises(JournalConflict):
        journal.advance(
            "offer-1", expected_revision=current.revision, to_state=target, **STEP_FIELDS.get(target, {})
        )

    assert journal.get("offer-1") == current


@pytest.mark.parametrize("missing", sorted(STEP_FIELDS["launching"]))
def test_launching_without_the_digest_sequence_and_artifact_is_rejected(
    journal: WorkerJournal, missing: str
) -> None:
    # Given a starting_acknowledged record
    current = walk(journal, "offer-1", "starting_acknowledged")
    fields = {k: v for k, v in STEP_FIELDS["launching"].items() if k != missing}

    # When launching is written without one of its fields
    with pytest.raises(JournalInvalid) as caught:
        journal.advance("offer-1", expected_revision=current.revision, to_state="launching", **fields)

    # Then nothing is written: no launch without an authenticatable receipt
    assert caught.value.details["reason"] == "field_missing"
    assert journal.get("offer-1") == current


@pytest.mark.parametrize(
    "raw",
    [
        "cb_" + "A1b2-C3d4_" * 5,
        "x" * 64,
        hashlib.sha256(b"t").hexdigest().upper(),
        hashlib.sha256(b"t").hexdigest()[:63],
        hashlib.sha256(b"t").hexdigest() + "\n",
        hashlib.sha256(b"t").hexdigest() + "00",
    ],
    ids=["base64url_token", "not_hex", "uppercase", "short", "newline", "long"],
)
def test_a_raw_looking_token_in_the_digest_field_is_rejected_and_never_stored(
    journal: WorkerJournal, tmp_path: Path, raw: str
) -> None:
    current = walk(journal, "offer-1", "starting_acknowledged")

    with pytest.raises(JournalInvalid) as caught:
        journal.advance(
            "offer-1",
            expected_revision=current.revision,
            to_state="launching",
            completion_callback_sequence=1,
            completion_token_digest=raw,
            log_artifact_id="log-1",
        )

    assert caught.value.details["reason"] == "token_digest_invalid"
    assert raw.strip() not in str(caught.value)
    assert journal.get("offer-1") == current
    on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("worker.db"))
    assert raw.strip().encode() not in on_disk


@pytest.mark.parametrize(
    ("start", "target", "extra"),
    [
        ("accepted", "starting_acknowledged", {"executor_handle": "ql3lp1.x"}),
        ("starting_acknowledged", "launching", {"recovery_reason": "launch_outcome_unknown"}),
        ("launching", "started", {"log_artifact_id": "log-2"}),
        ("started", "running_acknowledged", {"completion_token_digest": SPEC_DIGEST}),
        ("running_acknowledged", "completion_acknowledged", {"executor_started_at_ms": START_MS}),
    ],
)
def test_a_field_that_belongs_to_another_state_is_rejected(
    journal: WorkerJournal, start: str, target: JournalState, extra: dict[str, Any]
) -> None:
    current = walk(journal, "offer-1", *PATH_TO[start])

    with pytest.raises(JournalInvalid) as caught:
        journal.advance(
            "offer-1",
            expected_revision=current.revision,
            to_state=target,
            **STEP_FIELDS.get(target, {}),
            **extra,
        )

    assert caught.value.details["reason"] == "field_not_allowed"
    assert journal.get("offer-1") == current


@pytest.mark.parametrize(
    "fields",
    [
        {"executor_handle": "", "executor_started_at_ms": START_MS},
        {"executor_handle": "ql3lp1 has spaces", "executor_started_at_ms": START_MS},
        {"executor_handle": "ql3lp1.x", "executor_started_at_ms": -1},
    ],
)
def test_started_needs_a_well_formed_handle_and_start_time(
    journal: WorkerJournal, fields: dict[str, Any]
) -> None:
    current = walk(journal, "offer-1", *PATH_TO["launching"])

    with pytest.raises(JournalInvalid):
        journal.advance("offer-1", expected_revision=current.revision, to_state="started", **fields)

    assert journal.get("offer-1") == current


@pytest.mark.parametrize("start", sorted(PATH_TO))
@pytest.mark.parametrize(
    "reason",
    [
        "launch_outcome_unknown",
        "control_plane_already_running",
        "control_plane_terminal",
        "lease_lost_local_execution_stopped",
        "lease_lost_local_execution_unverified",
        "process_exited_without_receipt",
        "completion_refused",
    ],
)
def test_every_in_flight_state_can_become_recovery_required(
    journal: WorkerJournal, start: str, reason: RecoveryReason
) -> None:
    current = walk(journal, "offer-1", *PATH_TO[start])

    record = journal.advance(
        "offer-1", expected_revision=current.revision, to_state="recovery_required", recovery_reason=reason
    )

    assert (record.state, record.recovery_reason, record.revision) == (
        "recovery_required",
        reason,
        current.revision + 1,
    )


@pytest.mark.parametrize(
    "path",
    [("start_failed",), ("starting_acknowledged", "launching", "recovery_required")],
    ids=["start_failed", "recovery_required"],
)
def test_recovery_required_is_not_entered_from_outside_the_in_flight_states(
    journal: WorkerJournal, path: tuple[JournalState, ...]
) -> None:
    current = walk(journal, "offer-1", *path)

    with pytest.raises(JournalConflict):
        journal.advance(
            "offer-1",
            expected_revision=current.revision,
            to_state="recovery_required",
            recovery_reason="control_plane_terminal",
        )

    assert journal.get("offer-1") == current


def test_recovery_required_needs_a_known_reason(journal: WorkerJournal) -> None:
    current = walk(journal, "offer-1", *PATH_TO["started"])

    with pytest.raises(JournalInvalid):
        journal.advance(
            "offer-1",
            expected_revision=current.revision,
            to_state="recovery_required",
            recovery_reason=cast(Any, "gone"),
        )
    with pytest.raises(JournalInvalid):
        journal.advance("offer-1", expected_revision=current.revision, to_state="recovery_required")

    assert journal.get("offer-1") == current


@pytest.mark.parametrize("reason", LEASE_LOST)
def test_completion_beats_a_lease_lost_recovery(
    journal: WorkerJournal, clock: Clock, reason: RecoveryReason
) -> None:
    # Given a running record whose lease was lost locally
    current = walk(journal, "offer-1", *PATH_TO["running_acknowledged"])
    lost = journal.advance(
        "offer-1", expected_revision=current.revision, to_state="recovery_required", recovery_reason=reason
    )
    clock.now += 2_000

    # When the completion is still accepted by the control plane
    done = journal.advance("offer-1", expected_revision=lost.revision, to_state="completion_acknowledged")

    # Then completion wins, keeping the reason as history
    assert done.state == "completion_acknowledged"
    assert done.completion_acknowledged_at_ms == clock.now
    assert done.recovery_reason == reason
    assert done.revision == lost.revision + 1


def test_an_unknown_offer_or_state_is_refused(journal: WorkerJournal) -> None:
    with pytest.raises(JournalConflict) as caught:
        journal.advance("offer-404", expected_revision=1, to_state="starting_acknowledged")
    assert caught.value.details["reason"] == "not_found"

    with pytest.raises(JournalInvalid):
        journal.advance("offer-1", expected_revision=1, to_state="finished")  # type: ignore[arg-type]
    with pytest.raises(JournalInvalid):
        journal.advance("offer-1", expected_revision=0, to_state="starting_acknowledged")


def test_a_clock_stepping_backwards_never_moves_updated_at_back(journal: WorkerJournal, clock: Clock) -> None:
    # Given a record last written at the current time
    before = walk(journal, "offer-1", "starting_acknowledged")

    # When the wall clock steps back an hour before the next write
    clock.now -= 3_600_000
    after = journal.advance("offer-1", expected_revision=before.revision, to_state="start_failed")

    # Then the record does not look older than it is (retention reads this time)
    assert after.updated_at_ms == before.updated_at_ms


def _launch_outcome_unknown(journal: WorkerJournal) -> Any:
    current = walk(journal, "offer-1", *PATH_TO["launching"])
    return journal.advance(
        "offer-1",
        expected_revision=current.revision,
        to_state="recovery_required",
        recovery_reason="launch_outcome_unknown",
    )


def test_an_unknown_launch_outcome_resumes_as_started_once_its_handle_is_found(
    journal: WorkerJournal,
) -> None:
    # Given a launch whose outcome is unknown (the worker died between the spawn and `started`)
    unknown = _launch_outcome_unknown(journal)

    # When the shim's own record of its identity is found
    started = journal.advance(
        "offer-1", expected_revision=unknown.revision, to_state="started", **STEP_FIELDS["started"]
    )

    # Then the record resumes as started, with the handle, never spawned again
    assert (started.state, started.executor_handle) == ("started", STEP_FIELDS["started"]["executor_handle"])


@pytest.mark.parametrize("reason", [*LEASE_LOST, "control_plane_terminal", "process_exited_without_receipt"])
def test_no_other_recovery_reason_goes_back_to_started(
    journal: WorkerJournal, reason: RecoveryReason
) -> None:
    current = walk(journal, "offer-1", *PATH_TO["launching"])
    lost = journal.advance(
        "offer-1", expected_revision=current.revision, to_state="recovery_required", recovery_reason=reason
    )

    with pytest.raises(JournalConflict) as caught:
        journal.advance(
            "offer-1", expected_revision=lost.revision, to_state="started", **STEP_FIELDS["started"]
        )

    assert caught.value.details["reason"] == "invalid_transition"
    assert journal.get("offer-1") == lost


def test_an_unknown_outcome_that_already_has_a_handle_does_not_go_back_to_started(
    journal: WorkerJournal,
) -> None:
    current = walk(journal, "offer-1", *PATH_TO["started"])
    lost = journal.advance(
        "offer-1",
        expected_revision=current.revision,
        to_state="recovery_required",
        recovery_reason="launch_outcome_unknown",
    )

    with pytest.raises(JournalConflict):
        journal.advance(
            "offer-1", expected_revision=lost.revision, to_state="started", **STEP_FIELDS["started"]
        )
