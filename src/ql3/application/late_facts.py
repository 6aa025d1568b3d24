"""Facts that arrive after their lease (docs/contracts.md §2.4): the completion of an attempt the
control plane already recorded ``lost`` (its lease expired, or it was reported lost) is still that
attempt's fact. Its authority is the callback token and the holder's identity, never a live lease.

When no later attempt of the run has started, the run takes the fact: its exit code and outcome, a
retry admitted but not started is withdrawn, and a run that had failed only because of the loss is
corrected. Otherwise (a later attempt started, a cancel ended the run, or the host stopped the command
at its lease fence) the fact is recorded on the old attempt only. ``lease_results.complete`` calls
here; the rows are locked there (Run -> Attempt -> lease) and here (the later attempt, its lease).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final, Literal

from ql3.application import lease_expiry, leases
from ql3.application.runs import AttemptChange, EventSpec, lock_attempt, write_attempt, write_run
from ql3.domain.model import Attempt, Run
from ql3.domain.states import is_run_terminal
from ql3.ports.storage import Transaction
from ql3.repositories import leases as lease_repo
from ql3.repositories import runs as run_repo

StopCause = Literal["timeout", "fence"]
STOP_CAUSES: Final = ("timeout", "fence")
CompletionResult = Literal["applied", "recorded", "already_terminal"]

# The run's error code when the host stopped a command because its lease could not be renewed.
LEASE_FENCED: Final = "LEASE_FENCED"
# The error code of an attempt admitted as a retry, withdrawn before it started by a late fact.
RETRY_WITHDRAWN: Final = "RETRY_WITHDRAWN"
LATE_FACT_EVENT: Final = "attempt.late_fact_recorded"
# Run states from which a late fact may end the run: the retry is admitted but not started.
_WITHDRAWABLE: Final = frozenset({"retry_wait", "queued", "dispatching"})


def fact_outcome(exit_code: int, stop_cause: StopCause | None) -> tuple[str, str | None]:
    """What the command's end means by itself: a timeout stop is ``timed_out`` (the code of the
    control plane's own timeout, ``leases.cancel_outcome``), else exit 0 succeeds and any other fails."""
    if stop_cause == "timeout":
        return "timed_out", "EXECUTION_TIMED_OUT"
    return ("succeeded", None) if exit_code == 0 else ("failed", "EXIT_NONZERO")


def has_fact(attempt: Attempt) -> bool:
    """Whether an ended attempt already holds its fact (a completion, or a late fact recorded)."""
    return attempt.exit_code is not None or attempt.status != "lost"


def record(
    tx: Transaction,
    run: Run,
    attempt: Attempt,
    *,
    worker_id: str,
    exit_code: int,
    stop_cause: StopCause | None,
) -> tuple[CompletionResult, str]:
    """The late fact of ``attempt`` (``lost``, no fact yet, token and sequence already checked)."""
    later = [a for a in run_repo.list_attempts(tx, run.id) if a.attempt > attempt.attempt]
    fact, code = fact_outcome(exit_code, stop_cause)
    outcome, code = leases.cancel_outcome(run, fact, code)
    takes_fact = (
        stop_cause != "fence"  # a command stopped at its fence decides nothing: the loss stands
        and all(a.status == "claimed" for a in later)  # no later attempt started
        and (
            run.status in _WITHDRAWABLE
            # a run that failed only because this attempt was lost (no retry left)
            or (run.status == "failed" and not later and run.exit_code is None)
        )
    )
    now = tx.now_ms()
    payload: dict[str, object] = {"attempt": attempt.attempt, "exit_code": exit_code}
    if takes_fact:
        payload["outcome"] = outcome
    event = EventSpec(
        type=LATE_FACT_EVENT, actor_type="worker", actor_id=worker_id, attempt_id=attempt.id, payload=payload
    )
    if not takes_fact:
        write_run(tx, run, run, [event], late_fact=True)
        write_attempt(tx, attempt, replace(attempt, exit_code=exit_code))
        return "recorded", attempt.status
    events = [event]
    change: AttemptChange | None = None
    withdrawn = lock_attempt(tx, later[0].id) if later else None
    if withdrawn is not None:
        change = AttemptChange(
            attempt=withdrawn,
            new=replace(withdrawn, status="cancelled", finished_at_ms=now, error_code=RETRY_WITHDRAWN),
        )
        events.append(
            EventSpec(
                type="attempt.cancelled",
                actor_type="worker",
                actor_id=worker_id,
                attempt_id=withdrawn.id,
                payload={"attempt": withdrawn.attempt, "error_code": RETRY_WITHDRAWN},
            )
        )
    events.append(
        EventSpec(
            type=f"run.{outcome}",
            actor_type="worker",
            actor_id=worker_id,
            attempt_id=attempt.id,
            payload={"from": run.status, "to": outcome},
            dedupe_key=f"run-transition:{run.version}:{outcome}",
        )
    )
    # A corrected run keeps the time it ended; a run waiting for its retry ends now.
    finished = run.finished_at_ms if is_run_terminal(run.status) else now
    write_run(
        tx,
        run,
        replace(run, status=outcome, finished_at_ms=finished, exit_code=exit_code, error_code=code),
        events,
        change,
        late_fact=True,
    )
    write_attempt(tx, attempt, replace(attempt, exit_code=exit_code))
    if withdrawn is not None:
        leases.end_lease(tx, withdrawn.id, now)  # a claim offered to a worker: its slot is freed
    policy = lease_repo.get_retry_policy(tx, run.id)
    if policy is not None and policy.next_retry_at_ms is not None:
        lease_repo.schedule_retry(tx, policy, next_retry_at_ms=None)
    return "applied", outcome


def stopped_without_receipt(attempt: Attempt) -> bool:
    """An attempt a stop ended before its receipt arrived: cancelled or timed out, no exit code yet."""
    return attempt.status in ("cancelled", "timed_out") and attempt.exit_code is None


def fill_exit_code(
    tx: Transaction, run: Run, attempt: Attempt, *, worker_id: str, exit_code: int
) -> tuple[CompletionResult, str]:
    """The receipt of an attempt a stop already ended (``stopped_without_receipt``: the control plane
    proved its group gone first, as after an outage, when the supervisor's stop and the worker's
    deferred receipt race): nothing changes state, but the exit code is the attempt's fact, and its
    run's too when this attempt ended the run without one."""
    later = [a for a in run_repo.list_attempts(tx, run.id) if a.attempt > attempt.attempt]
    event = EventSpec(
        type=LATE_FACT_EVENT,
        actor_type="worker",
        actor_id=worker_id,
        attempt_id=attempt.id,
        payload={"attempt": attempt.attempt, "exit_code": exit_code},
    )
    takes_fact = not later and run.status == attempt.status and run.exit_code is None
    write_run(tx, run, replace(run, exit_code=exit_code) if takes_fact else run, [event], late_fact=True)
    write_attempt(tx, attempt, replace(attempt, exit_code=exit_code))
    return ("applied", run.status) if takes_fact else ("recorded", attempt.status)


def lose(
    tx: Transaction,
    run: Run,
    attempt: Attempt,
    lease: leases.Lease,
    *,
    worker_id: str,
    exit_code: int,
    now: int,
) -> tuple[CompletionResult, str]:
    """The host stopped the command of an active attempt at its lease fence: the attempt is lost
    with its exit code, and lost retry decides what follows (a cancel intent still wins). Never a
    failure of the command."""
    outcome, code = leases.cancel_outcome(run, "lost", LEASE_FENCED)
    if outcome != "lost":
        leases.end_attempt(
            tx,
            run,
            attempt,
            run_status=outcome,
            error_code=code,
            exit_code=exit_code,
            actor_type="worker",
            actor_id=worker_id,
            now=now,
            bump_sequence=True,
            locked_lease=lease,
        )
        return "applied", outcome
    lost_run = leases.end_attempt(
        tx,
        run,
        attempt,
        run_status="lost",
        error_code=LEASE_FENCED,
        actor_type="worker",
        actor_id=worker_id,
        now=now,
        bump_sequence=False,
        lease_end="release",
        release_reason="lease_expired",
        locked_lease=lease,
    )
    lost = run_repo.get_attempt(tx, attempt.id)
    assert lost is not None  # locked by this transaction
    write_attempt(tx, lost, replace(lost, exit_code=exit_code))  # the fact, on the attempt only
    return "applied", lease_expiry.after_lost(tx, lost_run, lost, now, exit_code=exit_code)
