"""Management surface: low-sensitivity inspect, exact-CAS rearm with audit, summary, blocked drill-down."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ql3.application import cancellation_management, cancellation_supervisor, lease_results
from ql3.domain.cancellation import BlockedCursor, encode_blocked_cursor
from ql3.domain.errors import Conflict, FenceConflict, NotFound, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Project
from ql3.domain.offers import LeaseFence
from ql3.storage.queries import catalogue
from tests.support.builders import count, seed_project
from tests.support.cancellation_builders import (
    FakeSignal,
    claim,
    dispatch_row,
    events,
    record,
    request,
    running_in,
    running_runs,
)
from tests.support.databases import Harness

PRINCIPAL = "01a00000-0000-7000-8000-0000000000aa"


def _cycle(harness: Harness, signal: FakeSignal) -> Any:
    return cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=signal, owner="sup-a", page=64
    ).run_cycle()


def _blocked(
    harness: Harness, n: int = 1, status: str = "identity_mismatch"
) -> tuple[Project, list[LeaseFence]]:
    project, fences = running_runs(harness.db, n)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    _cycle(harness, FakeSignal(default=status))
    return project, fences


def _inspect(harness: Harness, project: Project, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = harness.db.transaction(
        lambda tx: cancellation_management.inspect(tx, project.id, run_id), write=False
    )
    return result


def _rearm(harness: Harness, project: Project, run_id: str, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "principal_id": PRINCIPAL,
        "mutation_id": "m-1",
        "expected_dispatch_version": 2,
        "expected_last_result": "identity_mismatch",
        "retry_delay_ms": 60_000,
    } | kw
    result: dict[str, Any] = harness.db.transaction(
        lambda tx: cancellation_management.rearm(tx, project.id, run_id, **args)
    )
    return result


def _summary(harness: Harness, project: Project) -> dict[str, Any]:
    result: dict[str, Any] = harness.db.transaction(
        lambda tx: cancellation_management.summary(tx, project.id), write=False
    )
    return result


def _page(harness: Harness, project: Project, cursor: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = harness.db.transaction(
        lambda tx: cancellation_management.blocked_page(tx, project.id, cursor), write=False
    )
    return result


def _run_version(harness: Harness, run_id: str) -> int:
    return int(harness.db.raw("SELECT version FROM runs WHERE id = ?", (run_id,))[0]["version"])


# -- inspect -------------------------------------------------------------------------------------------


def test_inspect_shows_the_operator_what_to_do_and_never_the_lease_capability(harness: Harness) -> None:
    project, (plain, waiting, leased, blocked, done) = running_runs(harness.db, 5)
    for fence in (waiting, leased, blocked, done):
        request(harness.db, project, fence.run_id)
    held = claim(harness.db, leased.run_id, owner="secret-owner")
    record(harness.db, claim(harness.db, blocked.run_id), "pid_mismatch")
    record(harness.db, claim(harness.db, done.run_id), "termination_requested")

    views = {f.run_id: _inspect(harness, project, f.run_id) for f in (plain, waiting, leased, blocked, done)}

    assert views[plain.run_id]["operatorAction"] == "none" and views[plain.run_id]["dispatch"] is None
    assert "cancelRequestedAtMs" not in views[plain.run_id]
    assert views[waiting.run_id]["operatorAction"] == "wait" and views[waiting.run_id]["dispatch"] is None
    assert views[waiting.run_id]["cancelReason"] == "user"
    lease_view = views[leased.run_id]
    assert lease_view["operatorAction"] == "wait"
    assert lease_view["dispatch"]["status"] == "leased" and "leaseExpiresAtMs" in lease_view["dispatch"]
    assert views[blocked.run_id]["operatorAction"] == "rearm"
    assert views[blocked.run_id]["dispatch"]["lastResult"] == "pid_mismatch"
    assert views[done.run_id]["operatorAction"] == "none"
    assert set(views[blocked.run_id]) == {
        "runStatus",
        "runVersion",
        "eventSequence",
        "cancelRequestedAtMs",
        "cancelReason",
        "operatorAction",
        "dispatch",
    }
    dump = json.dumps(views)
    digest = dispatch_row(harness.db, leased.run_id)["lease_token_digest"]
    for secret in ("secret-owner", "sup-a", digest, held.token, "ql3lp1", "lease_owner", "Digest", 'pid"'):
        assert secret not in dump


def test_inspect_is_scoped_to_the_project(harness: Harness) -> None:
    _, (fence,) = _blocked(harness)
    stranger = seed_project(harness.db, "other")

    with pytest.raises(NotFound):
        _inspect(harness, stranger, fence.run_id)


# -- rearm ---------------------------------------------------------------------------------------------


def test_rearm_moves_blocked_to_retry_wait_atomically_with_event_and_audit(harness: Harness) -> None:
    # Given a blocked dispatch (v2, identity_mismatch)
    project, (fence,) = _blocked(harness)
    run_version = _run_version(harness, fence.run_id)

    # When an operator rearms it with the exact version and result
    receipt = _rearm(harness, project, fence.run_id, retry_delay_ms=60_000)

    # Then dispatch, Run, event and audit all changed together, and the last result was kept
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["version"], row["last_result"]) == ("retry_wait", 3, "identity_mismatch")
    assert row["next_attempt_at_ms"] == row["updated_at_ms"] + 60_000
    assert _run_version(harness, fence.run_id) == run_version + 1
    last = events(harness.db, fence.run_id)[-1]
    assert (last["type"], last["actor_type"], last["actor_id"]) == (
        "run.cancel_dispatch_rearmed",
        "user",
        PRINCIPAL,
    )
    assert last["payload"] == {
        "mutation_id": "m-1",
        "previous_dispatch_version": 2,
        "dispatch_version": 3,
        "previous_result": "identity_mismatch",
        "retry_delay_ms": 60_000,
        "next_attempt_at_ms": row["next_attempt_at_ms"],
        "run_version": run_version + 1,
    }
    assert receipt == {
        "status": "rearmed",
        "attemptId": fence.attempt_id,
        "previousDispatchVersion": 2,
        "dispatchVersion": 3,
        "previousResult": "identity_mismatch",
        "retryDelayMs": 60_000,
        "nextAttemptAtMs": row["next_attempt_at_ms"],
        "runVersion": run_version + 1,
        "eventSequence": last["sequence"],
    }
    audit = harness.db.raw("SELECT * FROM cancellation_audit")
    assert len(audit) == 1
    assert (audit[0]["principal_id"], audit[0]["mutation_id"], audit[0]["run_id"]) == (
        PRINCIPAL,
        "m-1",
        fence.run_id,
    )
    assert audit[0]["operation"] == "cancellation.rearm"

    # And the database-time due gate holds: not claimable before, claimable after
    signal = FakeSignal()
    harness.advance_clock(30_000)
    _cycle(harness, signal)
    assert signal.calls == []
    harness.advance_clock(30_000)
    _cycle(harness, signal)
    assert len(signal.calls) == 1 and dispatch_row(harness.db, fence.run_id)["dispatch_count"] == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"expected_dispatch_version": 1}, "version_mismatch"),
        ({"expected_dispatch_version": 3}, "version_mismatch"),
        ({"expected_last_result": "pid_mismatch"}, "result_mismatch"),
    ],
)
def test_rearm_needs_the_exact_cas_and_writes_nothing_otherwise(
    harness: Harness, change: dict[str, Any], reason: str
) -> None:
    project, (fence,) = _blocked(harness)
    before = dispatch_row(harness.db, fence.run_id)
    run_version = _run_version(harness, fence.run_id)

    with pytest.raises(FenceConflict) as err:
        _rearm(harness, project, fence.run_id, **change)

    assert err.value.details["reason"] == reason
    assert dispatch_row(harness.db, fence.run_id) == before
    assert _run_version(harness, fence.run_id) == run_version
    assert count(harness.db, "cancellation_audit") == 0


def test_rearm_of_a_dispatch_that_is_not_blocked_is_refused(harness: Harness) -> None:
    project, (fence,) = _blocked(harness)
    _rearm(harness, project, fence.run_id, mutation_id="m-1")

    with pytest.raises(FenceConflict) as err:
        _rearm(harness, project, fence.run_id, mutation_id="m-2", expected_dispatch_version=3)

    assert err.value.details["reason"] == "not_blocked"
    assert count(harness.db, "cancellation_audit") == 1


def test_a_replayed_mutation_returns_the_same_receipt_and_a_drifted_one_conflicts(harness: Harness) -> None:
    # Given a committed rearm, after which the dispatch moved on
    project, (fence, other) = _blocked(harness, 2)
    receipt = _rearm(harness, project, fence.run_id)
    harness.advance_clock(60_000)
    _cycle(harness, FakeSignal())
    n_events = len(events(harness.db, fence.run_id))

    # When the same mutation is replayed exactly, the original receipt comes back with no writes
    assert _rearm(harness, project, fence.run_id) == receipt
    assert len(events(harness.db, fence.run_id)) == n_events and count(harness.db, "cancellation_audit") == 1

    # Then any drift of the same mutation id is a conflict
    for drift in (
        {"retry_delay_ms": 61_000},
        {"expected_dispatch_version": 5},
        {"expected_last_result": "invalid"},
        {"principal_id": "01a00000-0000-7000-8000-0000000000bb"},
    ):
        with pytest.raises(Conflict) as err:
            _rearm(harness, project, fence.run_id, **drift)
        assert not isinstance(err.value, FenceConflict)
    with pytest.raises(Conflict):
        _rearm(harness, project, other.run_id)  # the same mutation id on another run
    assert count(harness.db, "cancellation_audit") == 1
    assert dispatch_row(harness.db, other.run_id)["status"] == "blocked"


def test_a_failed_rearm_event_rolls_back_the_dispatch_and_the_audit(harness: Harness) -> None:
    project, (fence,) = _blocked(harness)
    before = dispatch_row(harness.db, fence.run_id)
    sequence = int(
        harness.db.raw("SELECT event_sequence FROM runs WHERE id = ?", (fence.run_id,))[0]["event_sequence"]
    )
    harness.db.raw(
        "INSERT INTO run_events (id, run_id, sequence, type, actor_type, payload_json, created_at_ms)"
        " VALUES ('planted', ?, ?, 'run.planted', 'system', '{}', 0)",
        (fence.run_id, sequence + 1),
    )

    with pytest.raises(Conflict):
        _rearm(harness, project, fence.run_id)

    assert dispatch_row(harness.db, fence.run_id) == before
    assert count(harness.db, "cancellation_audit") == 0


def test_a_failed_audit_write_rolls_back_the_dispatch_and_the_event(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an audit id that is already taken, so the audit insert (the last write) fails
    project, (fence,) = _blocked(harness)
    taken = new_id()
    harness.db.raw(
        "INSERT INTO cancellation_audit (id, project_id, run_id, principal_id, operation, mutation_id,"
        " created_at_ms, payload_json) VALUES (?, ?, ?, 'p', 'cancellation.rearm', 'older', 0, '{}')",
        (taken, project.id, fence.run_id),
    )
    monkeypatch.setattr(cancellation_management, "new_id", lambda: taken)
    before = dispatch_row(harness.db, fence.run_id)
    n_events = len(events(harness.db, fence.run_id))
    run_version = _run_version(harness, fence.run_id)

    with pytest.raises(Conflict):
        _rearm(harness, project, fence.run_id)

    assert dispatch_row(harness.db, fence.run_id) == before
    assert len(events(harness.db, fence.run_id)) == n_events
    assert _run_version(harness, fence.run_id) == run_version


@pytest.mark.parametrize(
    "bad",
    [
        {"retry_delay_ms": 999},
        {"retry_delay_ms": 86_400_001},
        {"expected_last_result": "handle_missing"},
        {"expected_last_result": "termination_requested"},
        {"mutation_id": ""},
        {"expected_dispatch_version": 0},
    ],
)
def test_rearm_inputs_are_validated(harness: Harness, bad: dict[str, Any]) -> None:
    project, (fence,) = _blocked(harness)

    with pytest.raises(ValidationFailed):
        _rearm(harness, project, fence.run_id, **bad)
    assert dispatch_row(harness.db, fence.run_id)["status"] == "blocked"


def test_rearm_of_a_terminal_run_is_refused(harness: Harness) -> None:
    project, (fence,) = _blocked(harness)
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )

    with pytest.raises(Conflict):
        _rearm(harness, project, fence.run_id)
    assert count(harness.db, "cancellation_audit") == 0


# -- summary -------------------------------------------------------------------------------------------


def test_summary_of_a_quiet_project_is_clear(harness: Harness) -> None:
    project, _ = running_runs(harness.db)

    summary = _summary(harness, project)

    assert summary == {
        "observedAtMs": summary["observedAtMs"],
        "dispatches": {"total": 0, "pending": 0, "leased": 0, "retryWait": 0, "dispatched": 0, "blocked": 0},
        "signals": {"due": 0, "expiredLease": 0},
        "blockingResults": {"identityMismatch": 0, "pidMismatch": 0, "unsupported": 0, "invalid": 0},
        "assessment": "clear",
        "operatorAction": "none",
    }


def test_summary_counts_reconcile_across_every_status_and_stay_in_the_project(harness: Harness) -> None:
    # Given one run in every dispatch state, plus an idle run
    project, fences = running_runs(harness.db, 8)
    r_blocked_id, r_blocked_pid, r_retry, r_done, r_leased, r_pending, r_expired, _idle = fences
    for fence in fences[:7]:
        request(harness.db, project, fence.run_id)
    record(harness.db, claim(harness.db, r_blocked_id.run_id), "identity_mismatch")
    harness.advance_clock(1_000)
    record(harness.db, claim(harness.db, r_blocked_pid.run_id), "pid_mismatch")
    record(harness.db, claim(harness.db, r_retry.run_id), "handle_missing", retry_base_ms=1_000)
    record(harness.db, claim(harness.db, r_done.run_id), "already_exited")
    claim(harness.db, r_leased.run_id, lease_ms=300_000)
    claim(harness.db, r_expired.run_id, lease_ms=5_000)
    harness.db.raw(
        "INSERT INTO cancellation_dispatches (run_id, attempt_id, project_id, status, version,"
        " dispatch_count, next_attempt_at_ms, created_at_ms, updated_at_ms)"
        " VALUES (?, ?, ?, 'pending', 0, 0, 0, 0, 0)",
        (r_pending.run_id, r_pending.attempt_id, project.id),
    )
    # and a blocked run in another project, which must never be counted here
    stranger = seed_project(harness.db, "other")
    (foreign,) = running_in(harness.db, stranger, 1, first=100)
    request(harness.db, stranger, foreign.run_id)
    record(harness.db, claim(harness.db, foreign.run_id), "unsupported")
    harness.advance_clock(10_000)
    oldest = dispatch_row(harness.db, r_blocked_id.run_id)["updated_at_ms"]

    # When the summary is read
    summary = _summary(harness, project)

    # Then every count reconciles with the rows and the invariants hold
    assert summary["dispatches"] == {
        "total": 7,
        "pending": 1,
        "leased": 2,
        "retryWait": 1,
        "dispatched": 1,
        "blocked": 2,
    }
    assert summary["signals"] == {"due": 2, "expiredLease": 1}
    assert summary["blockingResults"] == {
        "identityMismatch": 1,
        "pidMismatch": 1,
        "unsupported": 0,
        "invalid": 0,
    }
    assert summary["oldestBlockedAtMs"] == oldest <= summary["observedAtMs"]
    assert (summary["assessment"], summary["operatorAction"]) == ("attention_required", "inspect")
    d = summary["dispatches"]
    assert d["total"] == sum(d[k] for k in ("pending", "leased", "retryWait", "dispatched", "blocked"))
    assert d["blocked"] == sum(summary["blockingResults"].values())
    dump = json.dumps(summary)
    for fence in fences:
        assert fence.run_id not in dump and fence.attempt_id not in dump
    assert "sup-a" not in dump
    # And the other project sees only its own blocked row
    foreign_summary = _summary(harness, stranger)
    assert foreign_summary["dispatches"]["total"] == 1
    assert foreign_summary["blockingResults"]["unsupported"] == 1


def test_summary_is_converging_while_work_is_in_flight_and_ignores_ended_runs(harness: Harness) -> None:
    project, (waiting, ended) = running_runs(harness.db, 2)
    request(harness.db, project, waiting.run_id)
    request(harness.db, project, ended.run_id)
    record(harness.db, claim(harness.db, waiting.run_id), "dispatch_error")
    record(harness.db, claim(harness.db, ended.run_id), "invalid")
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, ended, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )

    summary = _summary(harness, project)

    assert (summary["assessment"], summary["operatorAction"]) == ("converging", "wait")
    assert summary["dispatches"]["retryWait"] == 1 and summary["dispatches"]["blocked"] == 0
    assert "oldestBlockedAtMs" not in summary


# -- blocked drill-down --------------------------------------------------------------------------------


def test_blocked_pages_are_16_rows_in_key_order_under_one_snapshot(harness: Harness) -> None:
    # Given 20 blocked runs here (some blocked later than others) and 3 in another project
    project, fences = running_runs(harness.db, 14)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    _cycle(harness, FakeSignal(default="identity_mismatch"))
    harness.advance_clock(1_000)
    later = running_in(harness.db, project, 6, first=50)
    for fence in later:
        request(harness.db, project, fence.run_id)
    _cycle(harness, FakeSignal(default="pid_mismatch"))
    stranger = seed_project(harness.db, "other")
    foreign = running_in(harness.db, stranger, 3, first=100, task="job3")
    for fence in foreign:
        request(harness.db, stranger, fence.run_id)
    _cycle(harness, FakeSignal(default="invalid"))
    all_ids = {f.run_id for f in fences + later}

    # When the first page is read
    first = _page(harness, project)

    # Then it holds exactly 16 items, strictly ascending by (blockedAtMs, runId), and a cursor
    keys = [(i["blockedAtMs"], i["runId"]) for i in first["items"]]
    assert len(keys) == 16 and keys == sorted(keys) and len(set(keys)) == 16
    assert all(set(i) == {"runId", "blockedAtMs"} for i in first["items"])
    assert first["truncated"] is True and first["nextCursor"].startswith("v1.")

    # And rows blocked after the snapshot never appear, while rearmed rows vanish
    harness.advance_clock(1_000)
    (late,) = running_in(harness.db, project, 1, first=200, task="job4")
    request(harness.db, project, late.run_id)
    _cycle(harness, FakeSignal(default="unsupported"))
    rearmed = later[-1]
    _rearm(harness, project, rearmed.run_id, expected_last_result="pid_mismatch")
    second = _page(harness, project, first["nextCursor"])

    assert second["snapshotAtMs"] == first["snapshotAtMs"]
    assert second["truncated"] is False and second["nextCursor"] is None
    page_two = [(i["blockedAtMs"], i["runId"]) for i in second["items"]]
    assert len(page_two) == 3 and page_two == sorted(page_two) and page_two[0] > keys[-1]
    seen = {k[1] for k in keys + page_two}
    assert seen == all_ids - {rearmed.run_id}
    assert late.run_id not in seen and not seen & {f.run_id for f in foreign}


def test_a_cursor_never_crosses_into_another_project(harness: Harness) -> None:
    project, fences = _blocked(harness, 2)
    stranger = seed_project(harness.db, "other")
    cursor = encode_blocked_cursor(
        BlockedCursor(snapshot_at_ms=harness.now_ms(), blocked_at_ms=0, run_id=new_id())
    )

    page = _page(harness, stranger, cursor)

    assert page["items"] == [] and page["truncated"] is False
    assert {i["runId"] for i in _page(harness, project)["items"]} == {f.run_id for f in fences}


def _b64(obj: object) -> str:
    import base64

    return "v1." + base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip(
        "="
    )


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "garbage",
        "v1.",
        "v2.eyJ9",
        "v1.!!!!",
        _b64({"snapshotAtMs": 5, "blockedAtMs": 1}),
        _b64({"blockedAtMs": 1, "snapshotAtMs": 5, "runId": "01a00000-0000-7000-8000-000000000000"}),
        _b64({"snapshotAtMs": 5, "blockedAtMs": 1, "runId": "01a00000-0000-7000-8000-000000000000", "x": 1}),
        _b64({"snapshotAtMs": 5, "blockedAtMs": 6, "runId": "01a00000-0000-7000-8000-000000000000"}),
        _b64({"snapshotAtMs": -1, "blockedAtMs": -2, "runId": "01a00000-0000-7000-8000-000000000000"}),
        _b64({"snapshotAtMs": 5, "blockedAtMs": 1, "runId": "not-a-run-id"}),
        _b64({"snapshotAtMs": 5, "blockedAtMs": True, "runId": "01a00000-0000-7000-8000-000000000000"}),
        _b64(
            {
                "snapshotAtMs": 9_000_000_000_000,
                "blockedAtMs": 1,
                "runId": "01a00000-0000-7000-8000-000000000000",
            }
        ),
        _b64({"snapshotAtMs": 5, "blockedAtMs": 1, "runId": "01a00000-0000-7000-8000-000000000000"}) + "==",
        "v1." + "A" * 400,
    ],
)
def test_a_malformed_cursor_is_a_validation_error(harness: Harness, cursor: str) -> None:
    project, _ = _blocked(harness)

    with pytest.raises(ValidationFailed):
        _page(harness, project, cursor)


def test_the_blocked_query_is_served_by_the_project_partial_index(harness: Harness) -> None:
    project, _ = _blocked(harness, 3)
    sql = catalogue(harness.dialect)["cancel_blocked_first"]
    params = {"project_id": project.id, "snapshot_at_ms": harness.now_ms(), "limit": 17}

    if harness.dialect == "sqlite":
        plan = [str(dict(r)) for r in harness.db._conn().execute("EXPLAIN QUERY PLAN " + sql, params)]
    else:
        with harness.db.pool.connection() as conn:
            conn.execute("SET enable_seqscan = off")
            plan = [str(r) for r in conn.execute(("EXPLAIN " + sql).encode(), params)]
            conn.execute("RESET enable_seqscan")

    assert "cancellation_dispatches_blocked" in "\n".join(plan)


def test_management_reads_never_change_a_row(harness: Harness) -> None:
    project, (fence,) = _blocked(harness)
    before = dispatch_row(harness.db, fence.run_id)
    run_version = _run_version(harness, fence.run_id)

    _inspect(harness, project, fence.run_id)
    _summary(harness, project)
    _page(harness, project)

    assert dispatch_row(harness.db, fence.run_id) == before
    assert _run_version(harness, fence.run_id) == run_version
