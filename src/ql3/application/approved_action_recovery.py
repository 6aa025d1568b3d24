"""Recovery of approved actions whose executor died after the start barrier: automatic only from
trusted evidence, otherwise a person resolves them (docs/contracts.md §10)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final, cast

from ql3.application import auth
from ql3.application.approvals import get_dispatch, require_role
from ql3.application.approved_action_handlers import Evidence, EvidenceProvider
from ql3.application.approved_action_runner import BatchItem, handlers_by_type
from ql3.application.approved_actions import finish_execution, get_execution, lock_execution
from ql3.application.parking import ItemGuard, Parked, guarded
from ql3.domain.approvals import (
    DEFAULT_PAGE,
    FINDINGS,
    MANUAL_DECISIONS,
    Dispatch,
    Execution,
    ManualDecision,
    Resolution,
    effective_execution_status,
    is_hex_digest,
    manual_resolution_digest,
    recovery_token_digest,
    rescan_delay_ms,
    validate_client_id,
    validate_code,
    validate_lease_ms,
    validate_owner,
    validate_page,
)
from ql3.domain.digests import digest_equals, new_token
from ql3.domain.errors import (
    Conflict,
    FenceConflict,
    NotFound,
    Ql3Error,
    ValidationFailed,
)
from ql3.domain.ids import new_id
from ql3.domain.model import Principal
from ql3.ports.storage import Database, Transaction
from ql3.repositories import actions as action_store

DEFAULT_RESOLVER_LEASE_MS: Final = 30_000

log = logging.getLogger("ql3.approved_actions.recovery")


# -- recovery -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryLease:
    dispatch_id: str
    token: str
    control_version: int
    execution_version: int
    scans: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolveReport:
    observed_at_ms: int
    scanned: int
    items: tuple[BatchItem, ...]

    def count(self, outcome: str) -> int:
        return sum(1 for item in self.items if item.outcome == outcome)


def _acquire_recovery(
    tx: Transaction, *, dispatch_id: str, owner: str, token: str, lease_ms: int
) -> tuple[RecoveryLease, Dispatch, Execution] | None:
    ex = lock_execution(tx, dispatch_id)
    now = tx.now_ms()
    if effective_execution_status(ex, now) != "recovery_required":
        return None
    control = action_store.lock_recovery(tx, dispatch_id)
    if (
        control is None
        or control.status != "armed"
        or control.next_scan_at_ms is None
        or control.next_scan_at_ms > now
    ):
        return None
    lease_until = control.resolver_lease_expires_at_ms
    if lease_until is not None and lease_until > now:
        return None
    acquired = action_store.acquire_recovery(
        tx,
        control,
        resolver_owner=owner,
        resolver_token_digest=recovery_token_digest(token),
        resolver_lease_expires_at_ms=now + lease_ms,
        now_ms=now,
    )
    if not acquired:
        return None
    lease = RecoveryLease(
        dispatch_id=dispatch_id,
        token=token,
        control_version=control.version + 1,
        execution_version=ex.version,
        scans=control.scan_count + 1,
    )
    return lease, get_dispatch(tx, dispatch_id), ex


def _record_finding(tx: Transaction, lease: RecoveryLease, *, finding: str, manual: bool) -> str:
    now = tx.now_ms()
    digest = recovery_token_digest(lease.token)
    if manual:
        written = action_store.recovery_to_manual(
            tx,
            lease.dispatch_id,
            expected_version=lease.control_version,
            resolver_token_digest=digest,
            last_finding=finding,
            now_ms=now,
        )
    else:
        written = action_store.record_recovery_finding(
            tx,
            lease.dispatch_id,
            expected_version=lease.control_version,
            resolver_token_digest=digest,
            last_finding=finding,
            next_scan_at_ms=now + rescan_delay_ms(lease.scans),
            now_ms=now,
        )
    return "lease_lost" if not written else ("manual" if manual else finding)


def _resolve_verified(tx: Transaction, lease: RecoveryLease, evidence: Evidence) -> str:
    """Resolution + terminal execution + closed control, atomically; CAS on the execution version so
    a late completion and this resolution cannot both win."""
    ex = lock_execution(tx, lease.dispatch_id)
    if ex.status != "executing" or ex.version != lease.execution_version:
        return "lost_race"
    control = action_store.lock_recovery(tx, lease.dispatch_id)
    if (
        control is None
        or control.status != "armed"
        or control.version != lease.control_version
        or control.resolver_token_digest is None
        or not digest_equals(control.resolver_token_digest, recovery_token_digest(lease.token))
    ):
        return "lease_lost"
    now = tx.now_ms()
    succeeded = evidence.finding == "verified_succeeded"
    mutation_id = new_id()
    result_code = evidence.result_code or evidence.finding
    action_store.insert_resolution(
        tx,
        Resolution(
            dispatch_id=ex.dispatch_id,
            project_id=ex.project_id,
            mutation_id=mutation_id,
            expected_execution_version=ex.version,
            source="resolver",
            resolution="verified_succeeded" if succeeded else "verified_failed",
            outcome="succeeded" if succeeded else "failed",
            actor_type="system",
            actor_id=str(control.resolver_owner),
            actor_role=None,
            reason_code=evidence.finding,
            evidence_digest=evidence.evidence_digest,
            created_at_ms=now,
        ),
    )
    finish_execution(
        tx,
        ex,
        status="succeeded" if succeeded else "failed",
        mutation_id=mutation_id,
        result_code=result_code,
        result_digest=evidence.evidence_digest if succeeded else None,
        now=now,
    )
    action_store.resolve_recovery(
        tx,
        ex.dispatch_id,
        last_finding=evidence.finding,
        evidence_digest=evidence.evidence_digest,
        resolution_mutation_id=mutation_id,
        now_ms=now,
    )
    return "resolved_succeeded" if succeeded else "resolved_failed"


class RecoveryResolver:
    """``resolve_batch()`` scans armed recovery controls of lapsed ``executing`` rows, takes its own
    resolver lease (probing only), asks the action type's evidence provider and either resolves from
    verified evidence, records the finding for a later scan, or leaves the row for a person."""

    def __init__(
        self,
        db: Database,
        providers: Iterable[EvidenceProvider] | Mapping[str, EvidenceProvider],
        owner: str,
        *,
        page: int = DEFAULT_PAGE,
        lease_ms: int = DEFAULT_RESOLVER_LEASE_MS,
        guard: ItemGuard | None = None,
    ) -> None:
        self._db = db
        self._guard = guard
        self._providers: dict[str, EvidenceProvider] = handlers_by_type(providers)
        self.owner = validate_owner(owner)
        self.page = validate_page(page)
        self.lease_ms = validate_lease_ms(lease_ms)

    def resolve_batch(self) -> ResolveReport:
        def read(tx: Transaction) -> tuple[int, list[str]]:
            now = tx.now_ms()
            return now, action_store.recovery_due_ids(tx, now_ms=now, limit=self.page)

        observed, page = self._db.transaction(read, write=False)
        items = tuple(BatchItem(dispatch_id=d, outcome=self._guarded(d)) for d in page)
        return ResolveReport(observed_at_ms=observed, scanned=len(page), items=items)

    def _guarded(self, dispatch_id: str) -> str:
        outcome = guarded(self._guard, "recovery", dispatch_id, partial(self._one, dispatch_id))
        return "parked" if isinstance(outcome, Parked) else outcome

    def _one(self, dispatch_id: str) -> str:
        try:
            acquired = self._db.transaction(
                partial(
                    _acquire_recovery,
                    dispatch_id=dispatch_id,
                    owner=self.owner,
                    token=new_token(),
                    lease_ms=self.lease_ms,
                )
            )
        except Ql3Error:
            return "acquire_failed"
        if acquired is None:
            return "skipped"
        lease, dispatch, execution = acquired
        provider = self._providers.get(dispatch.action_type)
        if provider is None or provider.recovery_mode != "automatic":
            finding = "manual_only" if provider is not None else "unsupported"
            return self._write(partial(_record_finding, lease=lease, finding=finding, manual=True))
        try:
            evidence = provider.probe(self._db, dispatch, execution)
        except Exception as exc:
            log.warning(
                "recovery probe failed", extra={"action": "action.probe_failed", "error": type(exc).__name__}
            )
            evidence = Evidence(finding="unavailable")
        if evidence.finding not in FINDINGS:
            evidence = Evidence(finding="conflict")
        if evidence.finding in ("verified_succeeded", "verified_failed"):
            if not is_hex_digest(evidence.evidence_digest) or (
                evidence.result_code is not None and not _is_code(evidence.result_code)
            ):
                return self._write(partial(_record_finding, lease=lease, finding="conflict", manual=True))
            return self._write(partial(_resolve_verified, lease=lease, evidence=evidence))
        if evidence.finding in ("still_running", "missing", "unavailable"):
            return self._write(partial(_record_finding, lease=lease, finding=evidence.finding, manual=False))
        return self._write(partial(_record_finding, lease=lease, finding=evidence.finding, manual=True))

    def _write(self, fn: Callable[[Transaction], str]) -> str:
        try:
            result: str = self._db.transaction(fn)
        except Ql3Error:
            return "write_failed"
        return result


def _is_code(value: str) -> bool:
    try:
        validate_code(value, "result_code")
    except ValidationFailed:
        return False
    return True


def resolve_manually(
    tx: Transaction,
    *,
    dispatch_id: str,
    project_id: str,
    principal: Principal,
    role: str,
    mutation_id: str,
    expected_execution_version: int,
    decision: str,
    reason_code: str,
) -> Execution:
    """A person closes a ``recovery_required`` execution: ``confirm_succeeded|confirm_failed|
    abandon_unknown`` -> ``succeeded|failed|blocked``. Needs a live user whose current role is ``role``
    and grants ``approval.recover``, and the exact execution version. There is no retry, reset or
    barrier clear; repeating the action needs a new plan, approval and dispatch. Same ``mutation_id``
    with the same content replays."""
    if decision not in MANUAL_DECISIONS:
        raise ValidationFailed("invalid decision", field="decision")
    validate_client_id(mutation_id, "mutation_id")
    validate_code(reason_code)
    if isinstance(expected_execution_version, bool) or not isinstance(expected_execution_version, int):
        raise ValidationFailed("invalid expected version", field="expected_execution_version")
    project = auth.resolve_project(tx, project_id)
    require_role(tx, principal, project, role=role, permission="approval.recover")
    ex = lock_execution(tx, dispatch_id)
    if ex.project_id != project.id:
        raise NotFound("approved action not found")
    existing = action_store.get_resolution(tx, dispatch_id)
    if existing is not None:
        if (
            existing.mutation_id == mutation_id
            and existing.resolution == decision
            and existing.actor_id == principal.id
            and existing.expected_execution_version == expected_execution_version
            and existing.reason_code == reason_code
        ):
            return ex
        raise Conflict("the approved action was already resolved")
    now = tx.now_ms()
    if effective_execution_status(ex, now) != "recovery_required":
        raise Conflict("the approved action is not recovery_required", status=ex.status)
    if ex.version != expected_execution_version:
        raise FenceConflict("the approved action changed", reason="version_mismatch")
    outcome = MANUAL_DECISIONS[decision]
    digest = None
    if outcome == "succeeded":
        digest = manual_resolution_digest(
            dispatch_id=dispatch_id,
            mutation_id=mutation_id,
            decision=decision,
            actor_id=principal.id,
            expected_version=expected_execution_version,
            at_ms=now,
        )
    action_store.insert_resolution(
        tx,
        Resolution(
            dispatch_id=dispatch_id,
            project_id=ex.project_id,
            mutation_id=mutation_id,
            expected_execution_version=expected_execution_version,
            source="manual",
            resolution=cast(ManualDecision, decision),  # one of MANUAL_DECISIONS, checked first
            outcome=outcome,
            actor_type="user",
            actor_id=principal.id,
            actor_role=role,
            reason_code=reason_code,
            evidence_digest=None,
            created_at_ms=now,
        ),
    )
    finish_execution(
        tx,
        ex,
        status=outcome,
        mutation_id=mutation_id,
        result_code=decision,
        result_digest=digest,
        now=now,
    )
    action_store.resolve_recovery(
        tx,
        dispatch_id,
        last_finding=None,
        evidence_digest=None,
        resolution_mutation_id=mutation_id,
        now_ms=now,
    )
    return get_execution(tx, dispatch_id)
