"""The journal's state machine under arbitrary sequences of requests (hypothesis, stateful): whatever
is asked, a refusal writes nothing, a success moves exactly one revision, nothing leaves a terminal
state, and no record goes back to a state it has left, except the one documented way back (an unknown
launch outcome resumed as ``started`` once its handle is found)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, get_args

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ql3.domain.journal import JournalConflict, JournalInvalid, JournalRecord, JournalState, RecoveryReason
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import STEP_FIELDS, Clock, make_offer

STATES: list[JournalState] = list(get_args(JournalState))
REASONS: list[RecoveryReason] = list(get_args(RecoveryReason))
TERMINAL = {"completion_acknowledged", "start_failure_acknowledged"}
MAIN_PATH: list[JournalState] = [
    "accepted",
    "starting_acknowledged",
    "launching",
    "started",
    "running_acknowledged",
    "completion_acknowledged",
]


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory()
        self.clock = Clock()
        self.journal = WorkerJournal.open(Path(self._dir.name) / "worker.db", clock=self.clock)
        self.record: JournalRecord = self.journal.accept(make_offer("offer-1")).record
        self.left: set[JournalState] = set()  # states this record has been in and moved out of

    def teardown(self) -> None:
        self.journal.close()
        self._dir.cleanup()

    @rule(
        to=st.sampled_from(STATES),
        reason=st.sampled_from(REASONS),
        stale=st.booleans(),
        with_fields=st.booleans(),
        tick=st.integers(0, 5_000),
    )
    def advance(
        self, to: JournalState, reason: RecoveryReason, stale: bool, with_fields: bool, tick: int
    ) -> None:
        self._try(to, reason, stale, with_fields, tick)

    @rule(reason=st.sampled_from(REASONS))
    def step_forward(self, reason: RecoveryReason) -> None:
        """The next state of the main path, so that the deep states are reached too."""
        state = self.record.state
        if state in MAIN_PATH[:-1]:
            self._try(MAIN_PATH[MAIN_PATH.index(state) + 1], reason, False, True, 10)

    @rule(reason=st.sampled_from(REASONS))
    def try_to_go_back(self, reason: RecoveryReason) -> None:
        """Ask for every state already left, with well-formed fields: each must be refused."""
        for state in sorted(self.left):
            self._try(state, reason, False, True, 0)

    def _try(
        self, to: JournalState, reason: RecoveryReason, stale: bool, with_fields: bool, tick: int
    ) -> None:
        self.clock.now += tick
        before = self.record
        fields: dict[str, Any] = dict(STEP_FIELDS.get(to, {})) if with_fields else {}
        if to == "recovery_required" and with_fields:
            fields["recovery_reason"] = reason
        if to == "started" and with_fields and before.executor_handle is not None:
            fields = {}  # a resume keeps the handle it already has
        revision = before.revision - 1 if stale else before.revision
        try:
            after = self.journal.advance("offer-1", expected_revision=revision, to_state=to, **fields)
        except (JournalConflict, JournalInvalid):
            assert self.journal.get("offer-1") == before  # a refusal writes nothing
            return
        assert not stale, "a stale revision was accepted"
        assert before.state not in TERMINAL, f"left terminal state {before.state}"
        assert (after.state, after.revision) == (to, before.revision + 1)
        if to in self.left:
            assert (before.state, to, before.recovery_reason) == (
                "recovery_required",
                "started",
                "launch_outcome_unknown",
            ), f"went back from {before.state} to {to}"
        event(f"moved {before.state} -> {to}")
        self.left.add(before.state)
        self.record = after

    @invariant()
    def stored_record_is_the_last_answer(self) -> None:
        assert self.journal.get("offer-1") == self.record


JournalMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, derandomize=True
)
test_the_journal_state_machine = JournalMachine.TestCase
