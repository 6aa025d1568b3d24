"""The lease holder's results: the starting and running ACKs, a start failure and completion, each
under the full fence of ``leases`` (docs/contracts.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from ql3.application import late_facts, leases
from ql3.application.late_facts import CompletionResult, StopCause
from ql3.application.runs import (
    AttemptChange,
    EventSpec,
    attempt_deadline_from_spec,
    write_run,
)
from ql3.domain.digests import digest_equals, sha256_hex
from ql3.domain.errors import Conflict, FenceConflict, NotFound, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Attempt, Run
from ql3.domain.offers import LeaseFence
from ql3.domain.states import ATTEMPT_TERMINAL, is_run_terminal
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import leases as repo
from ql3.repositories.leases import Lease

MAX_HANDLE_BYTES: Final = 512


AckResult = Literal["starting", "already_starting", "running", "already_running"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Held:
    """A result's rows, read in one statement under their locks (Run -> Attempt -> lease), with the
    transaction's clock."""

    run: Run
    attempt: Attempt
    rows: repo.FenceRows
    now: int

    def fence(
        self, fence: LeaseFence, *, allow_terminal_replay: bool = False, ignore_version: bool = False
    ) -> Lease:
        """``check_fence`` on the rows already read: no second read of the lease or the worker."""
        return leases.verify_fence(
            self.rows,
            fence,
            self.now,
            allow_terminal_replay=allow_terminal_replay,
            ignore_version=ignore_version,
        )


def _run_and_attempt(tx: Transaction, fence: LeaseFence, *, with_revision: bool = False) -> _Held:
    """The Run, the Attempt, the lease (each locked, in that order) and the worker in one statement;
    NotFound for a missing Run or Attempt, ``run_mismatch`` for an Attempt of another Run, before any
    fence check."""
    rows = repo.lock_fence_rows(
        tx,
        run_id=fence.run_id,
        attempt_id=fence.attempt_id,
        worker_id=fence.worker_id,
        with_revision=with_revision,
    )
    if rows.run is None or rows.run.id != fence.run_id:
        raise NotFound("run not found")
    if rows.attempt is None or rows.attempt.id != fence.attempt_id:
        raise NotFound("attempt not found")
    if rows.attempt.run_id != rows.run.id:
        raise FenceConflict(reason="run_mismatch")
    return _Held(run=rows.run, attempt=rows.attempt, rows=rows, now=tx.now_ms())


def _result_answer(
    tx: Transaction, kind: repo.ResultKind, fence: LeaseFence, args: dict[str, Any], channel: str | None
) -> repo.ResultAnswer:
    """PostgreSQL: the result's common case in one call of ``ql3_lease_result`` (migration 0014),
    with BEGIN and COMMIT in the same round trip when it opens the unit. The function makes every
    check the statement-by-statement path below makes and writes only when all pass; anything else
    it answers ``defer`` having written nothing, and that path then runs (in a new transaction when
    the call committed), deciding and refusing as on SQLite. The rows stay locked in the order Run ->
    Attempt -> lease."""
    answer = repo.result_in_one_statement(
        tx,
        kind=kind,
        run_id=fence.run_id,
        attempt_id=fence.attempt_id,
        worker_id=fence.worker_id,
        session_id=fence.session_id,
        worker_generation=fence.worker_generation,
        lease_generation=fence.lease_generation,
        token_digest=leases.lease_digest(fence.lease_token),
        args=args,
        event_ids=[new_id(), new_id()],
        channel=channel or "",
    )
    for notified in answer.notified:
        tx.notify(notified)  # the function sent the NOTIFY: the transaction only posts it locally
    return answer


def _result_in_one_statement(
    tx: Transaction, kind: repo.ResultKind, fence: LeaseFence, args: dict[str, Any], channel: str | None
) -> Lease | None:
    """An ACK by ``_result_answer``: the lease when the function wrote it, None (and nothing
    written) on SQLite or when it deferred."""
    if tx.dialect != "postgres":
        return None
    answer = _result_answer(tx, kind, fence, args, channel)
    if answer.answer == "defer":
        return None
    if answer.answer != kind or answer.lease is None:
        raise Conflict("the result function answered out of turn", status=answer.answer)
    return answer.lease


def ack_starting(tx: Transaction, fence: LeaseFence) -> tuple[AckResult, Lease]:
    """Attempt ``claimed -> starting`` (the Run stays dispatching); the deadline is persisted before spawn.
    It is computed here (``runs.attempt_deadline_from_spec``, from the pinned revision's spec read with
    the fence's rows), never taken from the worker's clock.

    Like every result of the lease holder, an ACK is fenced on the exact authority (worker, session,
    generations, token, live lease) but not on the renewal version: the holder's own renewal that
    committed a moment earlier must not fence its ACK (docs/dispatch.md).
    """
    done = _result_in_one_statement(tx, "starting", fence, {}, channels.ATTEMPTS)
    if done is not None:
        return "starting", done
    held = _run_and_attempt(tx, fence, with_revision=True)
    run, attempt = held.run, held.attempt
    lease = held.fence(fence, ignore_version=True)
    if attempt.status == "starting":
        return "already_starting", lease
    if attempt.status == "running":
        return "already_running", lease
    if attempt.status != "claimed" or run.status != "dispatching":
        raise Conflict("the attempt cannot start", status=attempt.status)
    if held.rows.revision_spec is None:
        raise NotFound("task revision not found")
    deadline = attempt_deadline_from_spec(tx, held.rows.revision_spec)
    write_run(
        tx,
        run,
        run,
        [
            EventSpec(
                type="attempt.starting",
                actor_type="worker",
                actor_id=fence.worker_id,
                attempt_id=attempt.id,
                payload={"attempt": attempt.attempt},
            )
        ],
        AttemptChange(attempt=attempt, new=replace(attempt, status="starting", deadline_at_ms=deadline)),
    )
    if deadline is not None:
        # A new deadline: the cancellation loop re-plans its sleep at once. An attempt without a
        # timeout gives it nothing to plan, so it is not woken once per run while work flows.
        tx.notify(channels.ATTEMPTS)
    return "starting", lease


def ack_running(
    tx: Transaction,
    fence: LeaseFence,
    *,
    pid: int,
    handle: str,
    log_artifact_id: str,
    callback_sequence: int,
    callback_token_digest: str,
) -> tuple[AckResult, Lease]:
    """Attempt and Run -> running with DB times; an identical replay is idempotent, another handle is not."""
    if len(handle.encode()) > MAX_HANDLE_BYTES or pid < 1 or callback_sequence < 1:
        raise ValidationFailed("invalid running ACK")
    if len(callback_token_digest) != 64:
        raise ValidationFailed("invalid callback digest")
    done = _result_in_one_statement(
        tx,
        "running",
        fence,
        {
            "pid": pid,
            "handle": handle,
            "log_artifact_id": log_artifact_id,
            "callback_sequence": callback_sequence,
            "callback_token_digest": callback_token_digest,
        },
        None,
    )
    if done is not None:
        return "running", done
    held = _run_and_attempt(tx, fence)
    run, attempt, now = held.run, held.attempt, held.now
    # Not fenced on the renewal version: see ack_starting. A lost running ACK leaves no callback
    # digest, and then even a valid receipt of the current holder could never complete the run.
    lease = held.fence(fence, ignore_version=True)
    if attempt.status == "running":
        if (
            attempt.executor_handle == handle
            and attempt.pid == pid
            and attempt.callback_sequence == callback_sequence
        ):
            return "already_running", lease
        raise Conflict("a different handle is already running", reason="handle_mismatch")
    if attempt.status != "starting":
        raise Conflict("running requires starting", status=attempt.status)
    new_attempt = replace(
        attempt,
        status="running",
        pid=pid,
        executor_handle=handle,
        log_artifact_id=log_artifact_id,
        callback_sequence=callback_sequence,
        callback_token_hash=callback_token_digest,
        started_at_ms=now,
    )
    write_run(
        tx,
        run,
        replace(run, status="running", started_at_ms=now),
        [
            EventSpec(
                type="attempt.running",
                actor_type="worker",
                actor_id=fence.worker_id,
                attempt_id=attempt.id,
                payload={"attempt": attempt.attempt},
            ),
            EventSpec(
                type="run.running",
                actor_type="worker",
                actor_id=fence.worker_id,
                attempt_id=attempt.id,
                payload={"from": run.status, "to": "running"},
                dedupe_key=f"run-transition:{run.version}:running",
            ),
        ],
        AttemptChange(attempt=attempt, new=new_attempt),
    )
    return "running", lease


def ack_start_failure(tx: Transaction, fence: LeaseFence, *, error_code: str) -> str:
    """From ``starting``: outcome by cancel fact; lease completed (v+1); two events; atomic."""
    held = _run_and_attempt(tx, fence)
    run, attempt, now = held.run, held.attempt, held.now
    lease = held.fence(fence, allow_terminal_replay=True, ignore_version=True)
    if lease.status == "completed":
        if attempt.status in ATTEMPT_TERMINAL and lease.version == fence.lease_version + 1:
            return "already_terminal"
        raise FenceConflict(reason="not_leased")
    if attempt.status not in ("starting", "claimed"):
        raise Conflict("start failure requires starting", status=attempt.status)
    outcome, code = leases.cancel_outcome(run, "failed", "EXECUTOR_START_FAILED" if error_code else None)
    leases.end_attempt(
        tx,
        run,
        attempt,
        run_status=outcome,
        error_code=code or error_code,
        actor_type="worker",
        actor_id=fence.worker_id,
        now=now,
        bump_sequence=True,
        locked_lease=lease,
    )
    return outcome


def complete(
    tx: Transaction,
    fence: LeaseFence,
    *,
    callback_sequence: int,
    callback_token: str,
    exit_code: int,
    stop_cause: StopCause | None = None,
) -> tuple[CompletionResult, str]:
    """The one completion path for live close, receipt replay and late facts (docs/contracts.md §2.4).

    Checks relation, token hash (constant time) and sequence, and that ``fence`` was the lease's
    holder (``leases.verify_holder``); a live lease is not required: a fact is the authority of the
    callback token, whenever it arrives. An attempt still active ends with the fact: a committed cancel
    intent forces cancelled / timed_out; otherwise ``stop_cause`` ``timeout`` is timed_out (the exit
    code kept), ``fence`` makes the attempt lost (lost retry decides), exit 0 succeeds and anything
    else fails. An attempt the control plane already recorded ``lost`` takes it as a late fact
    (``late_facts.record``: ``applied`` when the run took it, else ``recorded``); any other ended
    attempt, or a fact already recorded, answers ``already_terminal`` and writes nothing.
    """
    if not 0 <= exit_code <= 255:
        raise ValidationFailed("exit code out of range")
    if stop_cause is not None and stop_cause not in late_facts.STOP_CAUSES:
        raise ValidationFailed("unknown stop cause", reason="stop_cause")
    if tx.dialect == "postgres" and stop_cause is None:
        # The function completes the common case only (a live lease, a running attempt); a late fact
        # or a stop cause is answered ``defer`` or never sent, and decided below.
        answer = _result_answer(
            tx,
            "complete",
            fence,
            {
                "callback_sequence": callback_sequence,
                "callback_digest": sha256_hex(callback_token),
                "exit_code": exit_code,
            },
            channels.SLOTS,  # a slot was freed, as end_attempt notifies
        )
        if answer.answer == "applied" and answer.outcome is not None:
            return "applied", answer.outcome
        if answer.answer != "defer":
            raise Conflict("the result function answered out of turn", status=answer.answer)
    held = _run_and_attempt(tx, fence)
    run, attempt = held.run, held.attempt
    if attempt.callback_token_hash is None:
        # No running ACK on record yet (its commit is still on its way): not a refusal, ask again.
        raise FenceConflict(reason="running_ack_missing")
    if not digest_equals(attempt.callback_token_hash, sha256_hex(callback_token)):
        raise FenceConflict(reason="callback_token_mismatch")
    if stop_cause == "timeout" and attempt.deadline_at_ms is None:
        raise ValidationFailed("a timeout stop needs an attempt with a deadline", reason="no_deadline")
    if attempt.status in ATTEMPT_TERMINAL or is_run_terminal(run.status):
        return _ended(tx, held, fence, callback_sequence, exit_code, stop_cause)
    if callback_sequence != attempt.callback_sequence:
        raise FenceConflict(reason="callback_sequence_mismatch")
    try:
        lease = held.fence(fence, ignore_version=True)
    except FenceConflict:
        # Its lease expired, was released, or its worker's session lapsed or was replaced: the fact
        # still ends its attempt, which nothing else took over (it is still active), as long as the
        # caller was the lease's holder.
        lease = leases.verify_holder(held.rows, fence)
    now = held.now
    if stop_cause == "fence":
        return late_facts.lose(
            tx, run, attempt, lease, worker_id=fence.worker_id, exit_code=exit_code, now=now
        )
    outcome, code = leases.cancel_outcome(run, *late_facts.fact_outcome(exit_code, stop_cause))
    leases.end_attempt(
        tx,
        run,
        attempt,
        run_status=outcome,
        error_code=code,
        exit_code=exit_code,
        actor_type="worker",
        actor_id=fence.worker_id,
        now=now,
        bump_sequence=True,
        locked_lease=lease,
    )
    return "applied", outcome


def _ended(
    tx: Transaction,
    held: _Held,
    fence: LeaseFence,
    callback_sequence: int,
    exit_code: int,
    stop_cause: StopCause | None,
) -> tuple[CompletionResult, str]:
    """A completion of an attempt that already ended, or of a run that did."""
    run, attempt = held.run, held.attempt
    stopped = late_facts.stopped_without_receipt(attempt)
    if attempt.status not in ATTEMPT_TERMINAL or (late_facts.has_fact(attempt) and not stopped):
        # A terminal run is immutable but for a late fact; an attempt's fact is recorded once: a
        # replay changes nothing.
        return "already_terminal", attempt.status
    leases.verify_holder(held.rows, fence)
    # A stop that ended the attempt moved its sequence on by one (``end_attempt``): its receipt carries
    # the one before. A lost attempt's sequence never moves.
    sequences = (
        {attempt.callback_sequence, attempt.callback_sequence - 1} if stopped else {attempt.callback_sequence}
    )
    if callback_sequence not in sequences:
        # Not this attempt's receipt: recorded, never a fact.
        if not is_run_terminal(run.status):
            write_run(
                tx,
                run,
                run,
                [
                    EventSpec(
                        type="attempt.late_callback_ignored",
                        actor_type="worker",
                        actor_id=fence.worker_id,
                        attempt_id=attempt.id,
                        payload={"attempt": attempt.attempt},
                    )
                ],
            )
        return "already_terminal", attempt.status
    if stopped:
        return late_facts.fill_exit_code(tx, run, attempt, worker_id=fence.worker_id, exit_code=exit_code)
    return late_facts.record(
        tx, run, attempt, worker_id=fence.worker_id, exit_code=exit_code, stop_cause=stop_cause
    )
