"""The bounded Run dispatcher (docs/dispatch.md, docs/contracts.md §7): one observation, no timer, at
most ``max_offers_per_cycle`` offers per cycle, claimed together in one write transaction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final

from ql3.application import lease_claims, leases, scripts, workers
from ql3.application.runs import latest_attempt
from ql3.application.tasks import get_revision
from ql3.application.variables import SharedEnvironments
from ql3.domain import leases as lease_rules
from ql3.domain.digests import digest_equals
from ql3.domain.errors import Ql3Error, ValidationFailed
from ql3.domain.execution import ExecutionSpec
from ql3.domain.offers import Offer, derive_lease_token, offer_id
from ql3.domain.tasks import TaskSpec, build_spec
from ql3.domain.workers import Placement, WorkerSnapshot, effective_placement, rank
from ql3.ports.storage import Database, Transaction
from ql3.repositories import dispatch as dispatch_repo
from ql3.repositories import runs as run_repo
from ql3.repositories import workers as worker_repo
from ql3.repositories.dispatch import RecoverableLease
from ql3.repositories.runs import QueuedCandidate

HARD_PAGE: Final = 64
HARD_PAGES: Final = 16
HARD_WORKERS: Final = 64
HARD_CLAIMS: Final = 64
MAX_RECOVERED_MEMORY: Final = 1024
SPEC_CACHE_SIZE: Final = 256


class DispatchCycleError(Ql3Error):
    """The dispatch cycle failed closed (cursor, page or identity invariant broken)."""

    code = "dispatch_cycle_failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchBudget:
    """Per-cycle budgets; invalid configurations are refused at start-up."""

    recovery_page: int = 8
    recovery_pages: int = 2
    candidate_page: int = 8
    candidate_pages: int = 2
    worker_page: int = 8
    worker_pages: int = 2
    claims: int = 8
    # New claims placed and claimed together in one cycle (``ql3 serve`` sizes it for its slots);
    # the candidate pages, the claim attempts above and the lease duration still bound the cycle.
    max_offers_per_cycle: int = 1
    lease_ms: int = 30_000

    def __post_init__(self) -> None:
        for name in ("recovery_page", "candidate_page", "worker_page"):
            if not 1 <= getattr(self, name) <= HARD_PAGE:
                raise ValidationFailed(f"{name} must be 1-{HARD_PAGE}", field=name)
        for name in ("recovery_pages", "candidate_pages", "worker_pages"):
            if not 1 <= getattr(self, name) <= HARD_PAGES:
                raise ValidationFailed(f"{name} must be 1-{HARD_PAGES}", field=name)
        if self.worker_page * self.worker_pages > HARD_WORKERS:
            raise ValidationFailed(f"at most {HARD_WORKERS} workers per placement", field="worker_pages")
        if not 1 <= self.claims <= HARD_CLAIMS:
            raise ValidationFailed(f"claims must be 1-{HARD_CLAIMS}", field="claims")
        if not 1 <= self.max_offers_per_cycle <= HARD_CLAIMS:
            raise ValidationFailed(
                f"max_offers_per_cycle must be 1-{HARD_CLAIMS}", field="max_offers_per_cycle"
            )
        lease_rules.RUN.validate(self.lease_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchResult:
    """What one cycle did. Carries no spec or plan unless an offer was produced."""

    reason: str
    # The cycle's offers, in queue order (recovery hands out one at a time).
    offers: tuple[Offer, ...] = ()
    # ``truncated``: a budget stopped the scan before the end of the queue; the next cycle continues
    # from the scan cursor, so the caller runs it now. A cycle that reached the end of the queue
    # without an offer made no progress and is never truncated: the loop then waits for a wake or its
    # idle cadence instead of spinning (docs/dispatch.md).
    truncated: bool = False
    # ``drained``: the cycle started at the head of the queue, reached its end and claimed every run it
    # saw, so a freed slot has nothing left to place (only a new run can give the loop work).
    drained: bool = False
    worker_calls: int = 0
    plan_calls: int = 0
    claim_calls: int = 0
    # Why runs were not placed: ``(run_id, reason)`` for each run the cycle examined and could not
    # place, ``(None, reason)`` for what stopped the cycle as a whole (application/dispatch_reasons.py).
    notes: tuple[tuple[str | None, str], ...] = ()

    @property
    def offer(self) -> Offer | None:
        """The first offer, None when the cycle made none."""
        return self.offers[0] if self.offers else None


@dataclass(slots=True)
class _Counters:
    worker_calls: int = 0
    plan_calls: int = 0
    claim_calls: int = 0
    notes: list[tuple[str | None, str]] = field(default_factory=list)


def _task_spec(tx: Transaction, task_id: str, revision: int) -> TaskSpec:
    return build_spec(get_revision(tx, task_id, revision).spec)


def build_plan(
    tx: Transaction,
    run_id: str,
    attempt_id: str,
    project_id: str,
    task_id: str,
    revision: int,
    shared: SharedEnvironments | None = None,
) -> tuple[ExecutionSpec, TaskSpec]:
    """Materialise the pinned revision into the attempt's ExecutionSpec (memory only), with the
    project's variables read in ``tx`` when ``shared`` is given."""
    task_spec = _task_spec(tx, task_id, revision)
    spec = ExecutionSpec.for_attempt(
        task_spec,
        run_id=run_id,
        attempt_id=attempt_id,
        project_id=project_id,
        task_id=task_id,
        task_revision=revision,
        shared_environment=() if shared is None else shared.within(tx, project_id),
        script=None if task_spec.script is None else scripts.payload(tx, project_id, task_spec.script),
    )
    return spec, task_spec


def candidate_plan(
    task_spec: TaskSpec,
    cand: QueuedCandidate,
    attempt_id: str,
    shared: Callable[[str], tuple[tuple[str, str], ...]] | None = None,
    *,
    db: Database | None = None,
    tx: Transaction | None = None,
) -> ExecutionSpec:
    """The ExecutionSpec of a queued candidate's claimed attempt (the dispatcher's and the pull's),
    with the project's variables (``shared``: cached). A script task reads its script's current
    content (docs/scripts.md): in ``tx`` when the caller holds one (never a second connection while
    one is held), else in one read of ``db``."""
    script = None
    if task_spec.script is not None:
        read = partial(scripts.payload, project_id=cand.project_id, path=task_spec.script)
        if tx is not None:
            script = read(tx)
        elif db is not None:
            script = db.transaction(read, write=False)
        else:
            raise ValueError("a script task's plan needs the database")
    return ExecutionSpec.for_attempt(
        task_spec,
        run_id=cand.run_id,
        attempt_id=attempt_id,
        project_id=cand.project_id,
        task_id=cand.task_id,
        task_revision=cand.task_revision,
        shared_environment=() if shared is None else shared(cand.project_id),
        script=script,
    )


class RunDispatcher:
    """``dispatch_once()`` is a plain call: it never creates timers or threads."""

    def __init__(
        self,
        db: Database,
        *,
        lease_secret: bytes,
        budget: DispatchBudget | None = None,
        incarnation_started_ms: int,
        local_worker_id: str | None = None,
        shared: SharedEnvironments | None = None,
    ) -> None:
        """``local_worker_id``: the dispatcher of ``ql3 serve`` hands offers to its own embedded
        worker, so with several servers on one database it places and recovers for that worker only.
        ``shared``: the project variables put in offers (docs/variables.md); None gives none."""
        if len(lease_secret) < 32:
            raise ValidationFailed("lease secret must be at least 32 bytes")
        self._db = db
        self._secret = lease_secret
        self.budget = budget or DispatchBudget()
        self._since = incarnation_started_ms
        self._recovered: set[str] = set()
        self._local_worker_id = local_worker_id
        self._shared = shared
        self._specs: OrderedDict[tuple[str, int], TaskSpec] = OrderedDict()
        # Only leases acquired before this incarnation need recovery; once a full walk finds none
        # left, later walks could only find the same ones again.
        self._recovery_done = False
        # Fair scanning: where the next cycle resumes after one that a budget stopped without an
        # offer, so what an earlier cycle could not place never hides the runs behind it. Reset to the
        # head of the queue after an offer (priority order) and once a scan reaches the end (wrap).
        self._scan_cursor: QueuedCandidate | None = None
        self._recovery_cursor: tuple[int, str] | None = None

    def _cached_spec(self, task_id: str, revision: int) -> TaskSpec:
        """Revisions are immutable, so their parsed specs are cached (bounded, least recently used)."""
        key = (task_id, revision)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._db.transaction(partial(_task_spec, task_id=task_id, revision=revision), write=False)
            if len(self._specs) >= SPEC_CACHE_SIZE:
                self._specs.popitem(last=False)
            self._specs[key] = spec
        else:
            self._specs.move_to_end(key)
        return spec

    def token_for(self, attempt_id: str) -> Callable[[int], str]:
        return lambda generation: derive_lease_token(self._secret, attempt_id, generation)

    # -- recovery --------------------------------------------------------------------------------

    def _recover(self, counters: _Counters) -> DispatchResult | None:
        """Offer the leases of an earlier incarnation again, before any new claim.

        Fails closed with an explicit reason (``truncated``: the next cycle continues after the row)
        when a recovery plan cannot be rebuilt (``recovery_plans_unavailable``) or the page budget runs
        out before the end (``recovery_budget_exhausted``); new claims start only once a walk reached
        the end. The cursor survives the cycle, so each cycle makes progress through the walk.
        """
        cursor = self._recovery_cursor
        seen: set[str] = set()
        for _ in range(self.budget.recovery_pages):
            page = self._db.transaction(partial(self._recovery_page, cursor=cursor), write=False)
            if len(page) > self.budget.recovery_page:
                raise DispatchCycleError("oversized recovery page")
            for found in page:
                key = (found.expires_at_ms, found.attempt_id)
                if found.attempt_id in seen or (cursor is not None and key <= cursor):
                    raise DispatchCycleError("recovery cursor stalled or repeated")
                seen.add(found.attempt_id)
                cursor = key
                self._recovery_cursor = cursor
                offer = self._db.transaction(
                    partial(self._recovery_offer, attempt_id=found.attempt_id), write=False
                )
                if isinstance(offer, str):
                    counters.plan_calls += 1
                    counters.notes.append((found.run_id, offer))
                    return self._result(offer, counters, truncated=True)
                if offer is not None and offer.offer_id not in self._recovered:
                    if len(self._recovered) >= MAX_RECOVERED_MEMORY:
                        self._recovered.clear()
                    self._recovered.add(offer.offer_id)
                    counters.plan_calls += 1
                    return DispatchResult(reason="recovered", offers=(offer,), plan_calls=counters.plan_calls)
            if len(page) < self.budget.recovery_page:
                self._recovery_done = True
                self._recovery_cursor = None
                return None
        counters.notes.append((None, "recovery_budget_exhausted"))
        return self._result("recovery_budget_exhausted", counters, truncated=True)

    def _recovery_page(self, tx: Transaction, cursor: tuple[int, str] | None) -> list[RecoverableLease]:
        return dispatch_repo.recoverable_leases(
            tx, since=self._since, after=cursor, limit=self.budget.recovery_page
        )

    def _recovery_offer(self, tx: Transaction, attempt_id: str) -> Offer | str | None:
        """The recovery offer; None when the lease no longer needs one (ended, expired, fenced,
        cancelled, another server's worker); a fail-closed reason when its plan cannot be rebuilt."""
        lease = leases.get_lease(tx, attempt_id)
        now = tx.now_ms()
        if lease is None or lease.status != "leased" or lease.expires_at_ms <= now:
            return None
        if self._local_worker_id is not None and lease.worker_id != self._local_worker_id:
            return None
        run = run_repo.get_run(tx, lease.run_id)
        if run is None:
            return "recovery_plans_unavailable"
        attempt = latest_attempt(tx, run.id)
        if run.status != "dispatching" or run.cancel_requested_at_ms is not None:
            return None
        if attempt is None or attempt.id != attempt_id or attempt.status != "claimed":
            return None
        worker = worker_repo.get_worker(tx, lease.worker_id)
        if (
            worker is None
            or worker.session_id != lease.worker_session_id
            or worker.generation != lease.worker_generation
            or worker.status not in ("online", "draining")
            or worker.lease_expires_at_ms <= now
        ):
            return None
        try:
            spec, _ = build_plan(
                tx, run.id, attempt_id, run.project_id, run.task_id, run.task_revision, self._shared
            )
        except Ql3Error:
            # The pinned revision is missing or no longer builds the same identity: never guess.
            return "recovery_plans_unavailable"
        return self._offer(lease, spec, "lease_recovery", None)

    def _offer(self, lease: leases.Lease, spec: ExecutionSpec, kind: Any, score: int | None) -> Offer:
        token = derive_lease_token(self._secret, lease.attempt_id, lease.lease_generation)
        if not digest_equals(lease.lease_token_digest, leases.lease_digest(token)):
            raise DispatchCycleError("lease token does not match its digest")
        return Offer(
            offer_id=offer_id(
                lease.attempt_id,
                lease.lease_generation,
                lease.worker_id,
                lease.worker_session_id,
                lease.worker_generation,
            ),
            delivery_kind=kind,
            fence=leases.fence_of(lease, token),
            lease_expires_at_ms=lease.expires_at_ms,
            spec=spec,
            spec_digest=spec.digest(),
            placement_score=score,
        )

    # -- new claims ------------------------------------------------------------------------------

    def _candidates(self, tx: Transaction, cursor: QueuedCandidate | None) -> list[QueuedCandidate]:
        after = None if cursor is None else (cursor.priority, cursor.queued_at_ms, cursor.run_id)
        return run_repo.queued_candidates(tx, after=after, limit=self.budget.candidate_page)

    def _page(
        self, tx: Transaction, cursor: QueuedCandidate | None, with_workers: bool
    ) -> tuple[list[QueuedCandidate], list[WorkerSnapshot] | None, int]:
        """One candidate page and, when it is not empty and asked for, the worker snapshot in the
        same read transaction (one round trip fewer per cycle on PostgreSQL). The snapshot is only a
        placement hint either way: every claim re-checks the worker under its row lock."""
        page = self._candidates(tx, cursor)
        if not page or not with_workers:
            return page, None, 0
        snapshot, calls = self._workers(tx)
        return page, snapshot, calls

    def _workers(self, tx: Transaction) -> tuple[list[WorkerSnapshot], int]:
        """The eligible workers (bounded pages, keyset by id) and the number of pages read. Each
        page is the last read of its unit: on PostgreSQL it travels with the COMMIT, and a further
        page is read in a transaction of its own (the snapshot is a placement hint, see ``_page``)."""
        if self._local_worker_id is not None:
            return workers.snapshot_one(tx, worker_id=self._local_worker_id, last=True), 1
        out: list[WorkerSnapshot] = []
        after = ""
        calls = 0
        for _ in range(self.budget.worker_pages):
            calls += 1
            page = workers.snapshot_page(tx, after=after, limit=self.budget.worker_page, last=True)
            if len(page) > self.budget.worker_page:
                raise DispatchCycleError("oversized worker page")
            for w in page:
                if w.worker_id <= after:
                    raise DispatchCycleError("worker cursor stalled or repeated")
                after = w.worker_id
            out.extend(page)
            if len(page) < self.budget.worker_page:
                break
        return out, calls

    def dispatch_once(self, max_offers: int | None = None) -> DispatchResult:
        """One cycle: recovery first, else up to ``max_offers`` (at most the budget's
        ``max_offers_per_cycle``) new claims placed from one scan and claimed together."""
        counters = _Counters()
        if not self._recovery_done:
            recovered = self._recover(counters)
            if recovered is not None:
                return recovered
        if max_offers is not None and max_offers < 1:
            raise ValidationFailed("max_offers must be at least 1", field="max_offers")
        want = min(self.budget.max_offers_per_cycle, self.budget.claims, max_offers or HARD_CLAIMS)
        from_head = self._scan_cursor is None
        cursor: QueuedCandidate | None = self._scan_cursor
        seen: set[str] = set()
        snapshot: list[WorkerSnapshot] | None = None
        checked_capacity = False
        outcome = "no_candidates"
        planned: list[_Planned] = []
        # Why the scan stopped before the end of the queue; None once it reached the end.
        stopped: str | None = None
        for page_no in range(self.budget.candidate_pages):
            page, fetched, calls = self._db.transaction(
                partial(self._page, cursor=cursor, with_workers=snapshot is None), write=False
            )
            if fetched is not None:
                snapshot = fetched
                counters.worker_calls += calls
            if len(page) > self.budget.candidate_page:
                raise DispatchCycleError("oversized candidate page")
            at_end = len(page) < self.budget.candidate_page
            for index, cand in enumerate(page):
                key = (-cand.priority, cand.queued_at_ms, cand.run_id)
                if cand.run_id in seen or (
                    cursor is not None and key <= (-cursor.priority, cursor.queued_at_ms, cursor.run_id)
                ):
                    raise DispatchCycleError("candidate cursor stalled or repeated")
                seen.add(cand.run_id)
                if not checked_capacity:
                    checked_capacity = True
                    assert snapshot is not None  # read with the first non-empty page
                    if snapshot and all(w.free_slots < 1 for w in snapshot):
                        # Every eligible worker is full: no candidate can be placed this cycle. The
                        # scan cursor stays where it was; a freed slot wakes the loop.
                        counters.notes.append((None, "no_capacity"))
                        return self._result("no_capacity", counters)
                if not snapshot:
                    counters.notes.append((None, "no_workers"))
                    return self._result("no_workers", counters)
                cursor = cand
                found = self._plan(cand, snapshot, counters)
                if isinstance(found, str):
                    outcome = found
                    counters.notes.append((cand.run_id, found))
                else:
                    planned.append(found)
                    _take_slot(snapshot, found.worker.worker_id)
                if len(planned) >= want or not any(w.free_slots > 0 for w in snapshot):
                    # The batch is full, or so is every worker as the snapshot tells it.
                    if not (at_end and index == len(page) - 1):
                        stopped = "offers"
                    break
            else:
                if at_end:
                    break
                if page_no == self.budget.candidate_pages - 1:
                    stopped = "scan_budget_exhausted"
                continue
            break
        offers, claim_outcome = self._claim_planned(planned, snapshot or [], counters)
        if claim_outcome is not None:
            outcome = claim_outcome
        if counters.claim_calls >= self.budget.claims and (not offers or outcome == "claim_budget_exhausted"):
            # The cycle spent its claims: what it could not place waits for the next cycle, which
            # continues behind the last run examined.
            stopped = "claim_budget_exhausted"
        if stopped in ("scan_budget_exhausted", "claim_budget_exhausted"):
            counters.notes.append((None, stopped))
        if offers:
            # Priority order: the next cycle starts at the head of the queue again. Only a cycle that
            # started there and reached the end without a budget stopping it saw the whole queue (as
            # of its read, after the loop's marks): the loop may then wait (docs/dispatch.md).
            self._scan_cursor = None
            return DispatchResult(
                reason="claimed",
                offers=tuple(offers),
                truncated=stopped is not None or not from_head,
                drained=stopped is None and from_head and len(offers) == len(seen),
                worker_calls=counters.worker_calls,
                plan_calls=counters.plan_calls,
                claim_calls=counters.claim_calls,
                notes=tuple(counters.notes),
            )
        if stopped is not None:
            self._scan_cursor = cursor
            reason = outcome if stopped == "offers" else stopped
            return self._result(reason, counters, truncated=True)
        # The end of the queue: every lap starts at the head (an offer resets the cursor), so the
        # whole queue was examined since the last offer and nothing could be placed. Wrap to the head
        # and report no progress: the loop waits for a wake (a new run, a freed slot) or its cadence.
        self._scan_cursor = None
        return self._result(outcome, counters)

    def _result(self, reason: str, counters: _Counters, *, truncated: bool = False) -> DispatchResult:
        return DispatchResult(
            reason=reason,
            truncated=truncated,
            worker_calls=counters.worker_calls,
            plan_calls=counters.plan_calls,
            claim_calls=counters.claim_calls,
            notes=tuple(counters.notes),
        )

    def _plan(
        self, cand: QueuedCandidate, snapshot: list[WorkerSnapshot], counters: _Counters
    ) -> _Planned | str:
        """The candidate's plan and its best-ranked worker with a free slot in the snapshot, or why
        it cannot be placed this cycle."""
        if cand.attempt_id is None or cand.attempt_status != "claimed":
            return "claim_raced"
        attempt_id = cand.attempt_id
        counters.plan_calls += 1
        try:
            task_spec = self._cached_spec(cand.task_id, cand.task_revision)
            placement = effective_placement(cand.executor_type, task_spec.require, task_spec.prefer)
        except Ql3Error:
            return "plans_unavailable"
        ranked = rank(placement, snapshot)
        if not ranked:
            return "no_match"
        try:
            spec = candidate_plan(task_spec, cand, attempt_id, self._shared, db=self._db)
        except Ql3Error:
            return "plans_unavailable"
        worker, score = ranked[0]
        return _Planned(
            run_id=cand.run_id,
            attempt_id=attempt_id,
            spec=spec,
            placement=placement,
            worker=worker,
            score=score,
        )

    def _claim_planned(
        self, planned: list[_Planned], snapshot: list[WorkerSnapshot], counters: _Counters
    ) -> tuple[list[Offer], str | None]:
        """Claim the planned runs, all of them in one write transaction (``lease_claims.claim_many``: each
        claim with its own fences, a refused one writes nothing). A claim refused for its worker
        (gone, or full after all) drops that worker from the snapshot and goes to the next ranked
        worker with a free slot, in one more transaction for all such claims, while the claim
        budget lasts. Answers the offers and the outcome of the last claim that placed nothing."""
        offers: list[Offer] = []
        outcome: str | None = None
        pending = planned
        while pending:
            counters.claim_calls += len(pending)
            answers = self._db.transaction(partial(self._claim_batch, batch=pending))
            retry: list[_Planned] = []
            for item, answer in zip(pending, answers, strict=True):
                if answer.status == "claimed" and answer.lease is not None:
                    offers.append(self._offer(answer.lease, item.spec, "new_claim", item.score))
                    continue
                if answer.status not in ("worker_unavailable", "capacity_exhausted"):
                    outcome = "claim_raced"
                    counters.notes.append((item.run_id, outcome))
                    continue
                snapshot[:] = [w for w in snapshot if w.worker_id != item.worker.worker_id]
                ranked = rank(item.placement, snapshot)
                if not ranked:
                    outcome = "no_match"
                    counters.notes.append((item.run_id, outcome))
                    continue
                if counters.claim_calls + len(retry) >= self.budget.claims:
                    outcome = "claim_budget_exhausted"
                    counters.notes.append((item.run_id, outcome))
                    continue
                worker, score = ranked[0]
                retry.append(replace(item, worker=worker, score=score))
                _take_slot(snapshot, worker.worker_id)
            pending = retry
        return offers, outcome

    def _claim_batch(self, tx: Transaction, batch: list[_Planned]) -> list[lease_claims.RunClaim]:
        return lease_claims.claim_many(
            tx,
            [
                lease_claims.ClaimRequest(
                    run_id=item.run_id,
                    attempt_id=item.attempt_id,
                    worker_id=item.worker.worker_id,
                    session_id=item.worker.session_id,
                    worker_generation=item.worker.generation,
                    token_for_generation=self.token_for(item.attempt_id),
                )
                for item in batch
            ],
            lease_ms=self.budget.lease_ms,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Planned:
    """A candidate to claim this cycle: its plan and the worker it goes to."""

    run_id: str
    attempt_id: str
    spec: ExecutionSpec
    placement: Placement
    worker: WorkerSnapshot
    score: int


def _take_slot(snapshot: list[WorkerSnapshot], worker_id: str) -> None:
    """One free slot of ``worker_id`` is spoken for in this cycle's snapshot (a placement hint: the
    claim checks the worker's capacity under its row lock)."""
    for i, w in enumerate(snapshot):
        if w.worker_id == worker_id:
            snapshot[i] = replace(w, free_slots=w.free_slots - 1)


__all__ = [
    "DispatchBudget",
    "DispatchCycleError",
    "DispatchResult",
    "RunDispatcher",
    "build_plan",
    "candidate_plan",
]
