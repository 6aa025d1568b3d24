"""Startup recovery and durability: a launching row is never re-spawned; committed rows survive a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import ql3
from ql3.domain.journal import JournalBudgetExceeded, JournalRecord
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import (
    PATH_TO as BASE_PATH_TO,
)
from tests.support.journal_builders import (
    SPEC_DIGEST,
    Clock,
    make_offer,
    walk,
)

# Recovery here starts from a spawned process.
PATH_TO = {
    **BASE_PATH_TO,
    "recovery_required": ("starting_acknowledged", "launching", "started", "recovery_required"),
}
SRC = Path(ql3.__file__).resolve().parents[1]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal" / "worker.db"


@pytest.fixture
def journal(path: Path, clock: Clock) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(path, clock=clock) as opened:
        yield opened


def _seed(journal: WorkerJournal, states: list[str]) -> dict[str, JournalRecord]:
    records = {}
    for index, state in enumerate(states):
        offer_id = f"offer-{index:02d}"
        journal.accept(make_offer(offer_id))
        records[offer_id] = walk(journal, offer_id, *PATH_TO[state])
    return records


def _run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_a_launching_record_found_on_reopen_becomes_recovery_required(path: Path, clock: Clock) -> None:
    # Given a launch that was recorded before the worker stopped
    with WorkerJournal.open(path, clock=clock) as journal:
        journal.accept(make_offer())
        launching = walk(journal, "offer-1", *PATH_TO["launching"])
    clock.now += 30_000

    # When the worker restarts and runs startup recovery
    with WorkerJournal.open(path, clock=clock) as journal:
        recovered = journal.startup_recovery()

        # Then the launch outcome is unknown: the record is handed to the reconciler, never re-launched
        assert len(recovered) == 1
        record = recovered[0]
        assert record.state == "recovery_required"
        assert record.recovery_reason == "launch_outcome_unknown"
        assert record.revision == launching.revision + 1
        assert record.updated_at_ms == clock.now
        assert record.completion_token_digest == launching.completion_token_digest
        assert record.completion_callback_sequence == launching.completion_callback_sequence
        assert journal.get("offer-1") == record

        # And a second pass changes nothing
        assert journal.startup_recovery() == [record]


def test_startup_recovery_returns_what_needs_reconciling_and_leaves_the_rest(journal: WorkerJournal) -> None:
    # Given one record in every state
    records = _seed(journal, list(PATH_TO))
    by_state = {r.state: r for r in records.values()}

    # When startup recovery runs
    result = journal.startup_recovery()

    # Then started, running_acknowledged and recovery_required come back unchanged, launching converted
    returned = {r.offer_id: r for r in result}
    assert returned[by_state["started"].offer_id] == by_state["started"]
    assert returned[by_state["running_acknowledged"].offer_id] == by_state["running_acknowledged"]
    assert returned[by_state["recovery_required"].offer_id] == by_state["recovery_required"]
    assert returned[by_state["launching"].offer_id].state == "recovery_required"
    assert set(returned) == {
        by_state[s].offer_id for s in ("started", "running_acknowledged", "recovery_required", "launching")
    }
    assert [r.offer_id for r in result] == sorted(returned)
    for state in ("accepted", "starting_acknowledged", "start_failed", "start_failure_acknowledged"):
        assert journal.get(by_state[state].offer_id) == by_state[state]


def test_startup_recovery_over_budget_fails_before_any_write(journal: WorkerJournal) -> None:
    # Given three launching records and a budget of two
    records = _seed(journal, ["launching", "launching", "launching", "accepted"])

    # When startup recovery runs with that budget
    with pytest.raises(JournalBudgetExceeded) as caught:
        journal.startup_recovery(page_size=1, max_pages=2)

    # Then it fails closed: not one record was converted
    assert caught.value.code == "journal_budget_exceeded"
    assert {k: journal.get(k) for k in records} == records


def test_startup_recovery_exactly_at_budget_succeeds(journal: WorkerJournal) -> None:
    # Records the recovery does not act on do not use up the budget.
    _seed(journal, ["launching", "accepted", "started", "start_failure_acknowledged"])

    result = journal.startup_recovery(page_size=1, max_pages=2)

    assert [r.state for r in result] == ["recovery_required", "started"]


@pytest.mark.parametrize(("page_size", "max_pages"), [(0, 1), (65, 1), (1, 0), (1, 17)])
def test_startup_recovery_budget_has_hard_limits(
    journal: WorkerJournal, page_size: int, max_pages: int
) -> None:
    with pytest.raises(ValueError):
        journal.startup_recovery(page_size=page_size, max_pages=max_pages)


def test_every_field_survives_close_and_reopen(path: Path, clock: Clock) -> None:
    with WorkerJournal.open(path, clock=clock) as journal:
        records = _seed(journal, list(PATH_TO))

    with WorkerJournal.open(path, clock=clock) as journal:
        assert {r.offer_id: r for r in journal.page()} == records


def test_a_launch_committed_before_a_crash_is_found_after_restart(path: Path, clock: Clock) -> None:
    # Given a worker process that records a launch and dies without closing anything
    script = """
        import os, sys
        from pathlib import Path
        from ql3.domain.journal import JournalOffer
        from ql3.worker.journal.store import WorkerJournal

        journal = WorkerJournal.open(Path(sys.argv[1]), clock=lambda: 1_000)
        journal.accept(JournalOffer(
            offer_id="offer-crash", run_id="run-1", attempt_id="attempt-1", lease_generation=1,
            execution_spec_digest=sys.argv[2], delivery_kind="new_claim", offer_json='{"lease": {}}',
        ))
        journal.advance("offer-crash", expected_revision=1, to_state="starting_acknowledged")
        journal.advance(
            "offer-crash", expected_revision=2, to_state="launching",
            completion_callback_sequence=7, completion_token_digest=sys.argv[2], log_artifact_id="log-7",
        )
        os._exit(0)
    """
    child = _run_child(script, str(path), SPEC_DIGEST)
    assert child.returncode == 0, child.stderr

    # When the worker restarts in this process (the dead owner's lock is gone with it)
    with WorkerJournal.open(path, clock=clock) as journal:
        found = journal.get("offer-crash")
        recovered = journal.startup_recovery()

    # Then the launch is there, exactly as committed, and becomes recovery_required without a re-launch
    assert found is not None
    assert (found.state, found.revision, found.completion_callback_sequence) == ("launching", 3, 7)
    assert found.completion_token_digest == SPEC_DIGEST
    assert found.log_artifact_id == "log-7"
    assert [(r.offer_id, r.state, r.recovery_reason) for r in recovered] == [
        ("offer-crash", "recovery_required", "launch_outcome_unknown")
    ]
