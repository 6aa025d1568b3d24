"""The approved-action dispatcher: one bounded batch of due executions, each claimed, inspected,
started across the durable barrier, executed once and completed (docs/contracts.md §10)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from ql3.application.approvals import get_dispatch
from ql3.application.approved_action_handlers import ActionHandler, InspectBlocked
from ql3.application.approved_actions import (
    ExecutionClaim,
    claim,
    complete,
    due_page,
    release_before_start,
    start,
)
from ql3.application.parking import ItemGuard, Parked, guarded
from ql3.domain.approvals import (
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PAGE,
    Dispatch,
    Execution,
    ExecutionFence,
    is_hex_digest,
    retry_delay_ms,
    validate_lease_ms,
    validate_max_attempts,
    validate_owner,
    validate_page,
    validate_result,
)
from ql3.domain.digests import digest_equals, new_token
from ql3.domain.errors import (
    Ql3Error,
    ValidationFailed,
)
from ql3.domain.ids import new_id
from ql3.ports.storage import Database, Transaction
from ql3.repositories.actions import DueRow

log = logging.getLogger("ql3.approved_actions.runner")


# -- dispatcher ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchItem:
    dispatch_id: str
    outcome: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchReport:
    """What one ``dispatch_batch()`` did; ids and low-cardinality outcomes only."""

    observed_at_ms: int
    scanned: int
    items: tuple[BatchItem, ...]
    next_cursor: tuple[int, str] | None

    def count(self, outcome: str) -> int:
        return sum(1 for item in self.items if item.outcome == outcome)


def handlers_by_type(handlers: object) -> dict[str, Any]:
    if isinstance(handlers, Mapping):
        return {str(key): value for key, value in handlers.items()}
    out: dict[str, Any] = {}
    for handler in cast(Iterable[Any], handlers):
        if handler.action_type in out:
            raise ValidationFailed("two handlers for one action type", field="handlers")
        out[handler.action_type] = handler
    return out


class ApprovedActionDispatcher:
    """``dispatch_batch()`` reads one due page at one observation time and, per row, claims, inspects,
    crosses the start barrier, executes and completes. It owns no timer; the lifecycle owner calls it.

    ``fault`` is a test hook called with ``"after_start_barrier"`` between the barrier commit and
    execute, and with ``"after_execute"`` between execute and the completion write; an exception it
    raises propagates (a simulated crash)."""

    def __init__(
        self,
        db: Database,
        handlers: Iterable[ActionHandler] | Mapping[str, ActionHandler],
        owner: str,
        *,
        page: int = DEFAULT_PAGE,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        fault: Callable[[str], None] | None = None,
        guard: ItemGuard | None = None,
    ) -> None:
        self._db = db
        self._guard = guard
        self._handlers: dict[str, ActionHandler] = handlers_by_type(handlers)
        self.owner = validate_owner(owner)
        self.page = validate_page(page)
        self.lease_ms = validate_lease_ms(lease_ms)
        self.max_attempts = validate_max_attempts(max_attempts)
        self._fault = fault or (lambda _point: None)

    def dispatch_batch(self, cursor: tuple[int, str] | None = None) -> BatchReport:
        def read(tx: Transaction) -> tuple[int, list[DueRow]]:
            return tx.now_ms(), due_page(tx, limit=self.page, after=cursor)

        observed, page = self._db.transaction(read, write=False)
        items = tuple(
            BatchItem(dispatch_id=r.dispatch_id, outcome=self._guarded(r.dispatch_id)) for r in page
        )
        last = (page[-1].eligible_at_ms, page[-1].dispatch_id) if len(page) == self.page else None
        return BatchReport(observed_at_ms=observed, scanned=len(page), items=items, next_cursor=last)

    def _release(self, fence: ExecutionFence, code: str, *, retry_at: int | None) -> str:
        try:
            ex: Execution = self._db.transaction(
                partial(
                    release_before_start,
                    fence=fence,
                    mutation_id=new_id(),
                    result_code=code,
                    retry_at_ms=retry_at,
                    max_attempts=self.max_attempts,
                )
            )
        except Ql3Error:
            return "release_failed"
        return ex.status

    def _guarded(self, dispatch_id: str) -> str:
        """``_one``, parked (outcome ``parked``) when it fails with an error that is not an outage."""
        outcome = guarded(self._guard, "action", dispatch_id, partial(self._one, dispatch_id))
        return "parked" if isinstance(outcome, Parked) else outcome

    def _one(self, dispatch_id: str) -> str:
        token = new_token()
        try:
            claimed: ExecutionClaim = self._db.transaction(
                partial(
                    claim,
                    dispatch_id=dispatch_id,
                    owner=self.owner,
                    token=token,
                    lease_ms=self.lease_ms,
                    max_attempts=self.max_attempts,
                )
            )
        except Ql3Error:
            return "claim_failed"
        if claimed.fence is None:
            return claimed.outcome
        fence = claimed.fence
        retry_at = claimed.now_ms + retry_delay_ms(fence.attempt)
        try:
            dispatch = self._db.transaction(lambda tx: get_dispatch(tx, dispatch_id), write=False)
        except Ql3Error:
            return self._release(fence, "dispatch_unavailable", retry_at=retry_at)
        handler = self._handlers.get(dispatch.action_type)
        if handler is None:
            return self._release(fence, "handler_missing", retry_at=retry_at)
        try:
            digest = self._db.transaction(lambda tx: handler.inspect(tx, dispatch), write=False)
        except InspectBlocked as exc:
            return self._release(fence, exc.result_code, retry_at=None)
        except Exception as exc:
            log.warning(
                "inspect failed", extra={"action": "action.inspect_failed", "error": type(exc).__name__}
            )
            return self._release(fence, "inspect_unavailable", retry_at=retry_at)
        if not is_hex_digest(digest) or not digest_equals(digest, dispatch.action_digest):
            return self._release(fence, "action_digest_drift", retry_at=None)
        try:
            started: ExecutionFence = self._db.transaction(
                partial(
                    start,
                    fence=fence,
                    approval_request_id=dispatch.approval_request_id,
                    action_digest=digest,
                )
            )
        except Ql3Error:
            return "start_refused"
        self._fault("after_start_barrier")
        return self._execute(handler, dispatch, started)

    def _execute(self, handler: ActionHandler, dispatch: Dispatch, fence: ExecutionFence) -> str:
        outcome, code, digest = "indeterminate", "handler_error", None
        try:
            result = handler.execute(self._db, dispatch, fence)
        except Exception as exc:
            # It may have failed after its side effect: never retried, recorded as indeterminate.
            log.warning(
                "handler failed", extra={"action": "action.handler_failed", "error": type(exc).__name__}
            )
            result = None
        self._fault("after_execute")
        if result is not None:
            try:
                validate_result(result.outcome, result.result_code, result.result_digest)
            except ValidationFailed:
                code = "unprovable_result"
            else:
                outcome, code, digest = result.outcome, result.result_code, result.result_digest
                fence = result.fence or fence
        try:
            ex: Execution = self._db.transaction(
                partial(
                    complete,
                    fence=fence,
                    mutation_id=new_id(),
                    outcome=outcome,
                    result_code=code,
                    result_digest=digest,
                )
            )
        except Exception as exc:
            # The row stays executing and becomes recovery_required; it is never executed again.
            log.warning(
                "completion failed", extra={"action": "action.completion_failed", "error": type(exc).__name__}
            )
            return "completion_failed"
        return ex.status
