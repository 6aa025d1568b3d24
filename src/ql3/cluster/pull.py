"""The worker pull (docs/cluster.md "Pull"): place and claim one run for one authenticated session.

The worker proposes a lease token (256 bits, URL-safe) and the offer id bound to it
(``pull_offer_id``); the server places with the database clock and bounded keyset pages, claims only
for the session the registry holds, and stores only the token's digest. A retry after a lost response
presents the same pair and gets the same offer back, rebuilt from the live lease and the pinned
revision (constant-time digest compare). Pulls of one worker serialise on its registry row, so two
replicas answering the same retry never create two leases for one token.

Each replica keeps, per worker session, where that worker's walk of the queue stopped (a bounded
table, oldest evicted): a head of runs this worker cannot take never starves the ones behind them,
as the dispatcher's fair scan. The cursor is only a hint - every claim is still fenced and locked -
so several replicas serving one worker, an evicted entry or a restart cost a rescan, nothing more.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

from ql3.application import lease_claims, leases, workers
from ql3.application.dispatcher import build_plan, candidate_plan
from ql3.application.tasks import get_revision
from ql3.application.variables import SharedEnvironments
from ql3.domain import leases as lease_rules
from ql3.domain.digests import digest_equals, domain_digest
from ql3.domain.errors import Conflict, FenceConflict, Ql3Error, ValidationFailed
from ql3.domain.execution import ExecutionSpec
from ql3.domain.offers import Offer
from ql3.domain.tasks import TaskSpec, build_spec
from ql3.domain.workers import WorkerSnapshot, effective_placement, rank
from ql3.ports import channels
from ql3.ports.storage import Database, Transaction
from ql3.repositories import runs as run_repo
from ql3.repositories import workers as worker_repo
from ql3.repositories.runs import QueuedCandidate
from ql3.repositories.workers import WorkerRecord

PULL_OFFER_DOMAIN: Final = "ql3.pull-offer.v1"
LEASE_TOKEN_RE: Final = re.compile(r"^[A-Za-z0-9_-]{43,128}$")
OFFER_ID_RE: Final = re.compile(r"^[0-9a-f]{64}$")
MAX_WAIT_MS: Final = 20_000
MAX_PULL_PAIRS: Final = 16  # offers one pull may claim (the worker proposes one pair a free slot)
LIVE_LEASE_PAGE: Final = 64
LIVE_LEASE_PAGES: Final = 16  # 1,024 = the largest worker capacity
SPEC_CACHE_SIZE: Final = 256
MAX_IMMEDIATE_RETRIES: Final = 4
MAX_SCAN_CURSORS: Final = 4096  # per replica; past it the oldest walk starts again at the head
WAKE_CHANNELS: Final = (channels.RUNS, channels.SLOTS)


class OfferConflict(Conflict):
    """The offer id was already used with another lease token or another session."""

    code = "offer_conflict"


def pull_offer_id(worker_id: str, lease_token: str) -> str:
    """The offer id a worker proposes with ``lease_token``: a retry presents the same pair, and no
    other token can ever be presented under this id."""
    return domain_digest(PULL_OFFER_DOMAIN, f"{worker_id}\0{lease_token}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PullBudget:
    candidate_page: int = 16
    candidate_pages: int = 4
    lease_ms: int = 30_000

    def __post_init__(self) -> None:
        if not 1 <= self.candidate_page <= 64:
            raise ValidationFailed("candidate_page must be 1-64", field="candidate_page")
        if not 1 <= self.candidate_pages <= 16:
            raise ValidationFailed("candidate_pages must be 1-16", field="candidate_pages")
        lease_rules.RUN.validate(self.lease_ms)


@dataclass(frozen=True, slots=True)
class PullPair:
    """One more (offer id, lease token) pair of a pull that may claim several runs."""

    offer_id: str
    lease_token: str

    def __repr__(self) -> str:  # the token never reaches a log line
        return f"PullPair(offer_id={self.offer_id[:12]}…)"


@dataclass(frozen=True, slots=True, kw_only=True)
class PullRequest:
    worker_id: str  # from the credential, never from the body
    session_id: str  # what the worker believes; checked against the registry
    generation: int
    offer_id: str
    lease_token: str
    # Further pairs, one per further free slot: the pull claims up to 1 + len(more) runs in its
    # transaction, each under its own pair (docs/cluster.md "Pull").
    more: tuple[PullPair, ...] = ()

    def __repr__(self) -> str:  # the token never reaches a log line
        return (
            f"PullRequest(worker_id={self.worker_id}, offer_id={self.offer_id[:12]}…, more={len(self.more)})"
        )

    def pairs(self) -> list[PullPair]:
        return [PullPair(self.offer_id, self.lease_token), *self.more]


@dataclass(frozen=True, slots=True, kw_only=True)
class PullResult:
    reason: str  # claimed | replayed | no_candidates | no_match | no_capacity | draining | ...
    offer: Offer | None = None
    more_offers: tuple[Offer, ...] = ()  # claimed (or replayed) under the request's further pairs
    truncated: bool = False
    cursor: QueuedCandidate | None = None  # where the next pass resumes after a truncated one
    walked_to_end: bool = False  # the pass reached the end of the queue: the next starts at the head
    # The pass walked the whole queue from its head and left no candidate behind (none was there,
    # or the one it claimed was the last): nothing is claimable until a new "runs" event.
    queue_empty: bool = False


IDLE_REASONS: Final = frozenset({"no_candidates", "no_match", "no_capacity", "claim_raced", "draining"})


def validate_request(req: PullRequest) -> None:
    if len(req.more) > MAX_PULL_PAIRS - 1:
        raise ValidationFailed(f"a pull proposes at most {MAX_PULL_PAIRS} pairs", field="more")
    seen: set[str] = set()
    for pair in req.pairs():
        if not LEASE_TOKEN_RE.fullmatch(pair.lease_token):
            raise ValidationFailed("the lease token must be 43-128 URL-safe characters", field="leaseToken")
        if not OFFER_ID_RE.fullmatch(pair.offer_id):
            raise ValidationFailed("invalid offer id", field="offerId")
        if pair.offer_id in seen:
            raise ValidationFailed("a pull proposes each offer id once", field="more")
        seen.add(pair.offer_id)
        if not digest_equals(pair.offer_id, pull_offer_id(req.worker_id, pair.lease_token)):
            # The same offer id can only ever carry one token: anything else is drift.
            raise OfferConflict(reason="offer_token_mismatch")


def _find_live(tx: Transaction, worker_id: str, digests: list[str]) -> list[tuple[int, leases.Lease]]:
    """The worker's live leases under any of ``digests``, each with the index of its digest, in
    that order (bounded index pages; every digest is compared with every lease, so the time does
    not depend on where a match is)."""
    found: dict[int, str] = {}
    after = ""
    for _ in range(LIVE_LEASE_PAGES):
        page = worker_repo.live_leases(tx, worker_id, after=after, limit=LIVE_LEASE_PAGE)
        for live in page:
            for i, digest in enumerate(digests):
                if digest_equals(live.lease_token_digest, digest) and i not in found:
                    found[i] = live.attempt_id
        if len(page) < LIVE_LEASE_PAGE:
            break
        after = page[-1].attempt_id
    out: list[tuple[int, leases.Lease]] = []
    for i in sorted(found):
        lease = leases.get_lease(tx, found[i])
        if lease is not None:
            out.append((i, lease))
    return out


def _check_session(tx: Transaction, req: PullRequest) -> WorkerRecord:
    worker = worker_repo.get_worker(tx, req.worker_id)
    if worker is None:
        raise FenceConflict("the worker is not registered", reason="worker_unavailable")
    if worker.session_id != req.session_id:
        raise FenceConflict(reason="worker_session_mismatch")
    if worker.generation != req.generation:
        raise FenceConflict(reason="worker_generation_mismatch")
    if worker.status == "offline" or worker.lease_expires_at_ms <= tx.now_ms():
        raise FenceConflict("the session is offline or expired", reason="worker_unavailable")
    return worker


def _offer(lease: leases.Lease, pair: PullPair, spec: ExecutionSpec) -> Offer:
    return Offer(
        offer_id=pair.offer_id,
        delivery_kind="new_claim",
        fence=leases.fence_of(lease, pair.lease_token),
        lease_expires_at_ms=lease.expires_at_ms,
        spec=spec,
        spec_digest=spec.digest(),
        placement_score=None,
    )


def _rebuild(
    tx: Transaction, lease: leases.Lease, req: PullRequest, pair: PullPair, shared: SharedEnvironments | None
) -> Offer:
    """The identical offer of a live lease, for a retry whose first response was lost."""
    if (lease.worker_session_id, lease.worker_generation) != (req.session_id, req.generation):
        raise OfferConflict(reason="offer_session_mismatch")
    run = run_repo.get_run(tx, lease.run_id)
    if run is None:
        raise OfferConflict(reason="offer_run_missing")
    spec, _ = build_plan(
        tx, lease.run_id, lease.attempt_id, run.project_id, run.task_id, run.task_revision, shared
    )
    return _offer(lease, pair, spec)


def _replayed(
    tx: Transaction,
    req: PullRequest,
    live: list[tuple[int, leases.Lease]],
    shared: SharedEnvironments | None,
) -> PullResult:
    """Every live lease of the request's pairs, re-delivered: a retry of a pull whose response was
    lost claims nothing more (its other pairs are dropped by the worker), so a pull still in flight
    and its retry never both claim."""
    pairs = req.pairs()
    offers = [_rebuild(tx, lease, req, pairs[i], shared) for i, lease in live]
    return PullResult(reason="replayed", offer=offers[0], more_offers=tuple(offers[1:]))


def _claimed(offers: list[Offer], *, queue_empty: bool) -> PullResult:
    return PullResult(
        reason="claimed", offer=offers[0], more_offers=tuple(offers[1:]), queue_empty=queue_empty
    )


class PullService:
    """Thread-safe; one per replica. ``pull`` long-polls up to ``wait_ms`` (at most 20 s), woken by
    commits on ``runs`` (new runs) and ``slots`` (freed slots) from this replica or, through
    LISTEN/NOTIFY, others."""

    def __init__(
        self,
        db: Database,
        *,
        budget: PullBudget | None = None,
        counters: Callable[[tuple[str, ...]], dict[str, int]] | None = None,
        wait_past: Callable[[dict[str, int], float], bool] | None = None,
        shared: SharedEnvironments | None = None,
    ) -> None:
        self._db = db
        self._shared = shared  # the project variables put in offers (docs/variables.md)
        self.budget = budget or PullBudget()
        notifier = getattr(db, "notifier", None)
        self._counters = counters or (notifier.counters if notifier is not None else None)
        self._wait_past = wait_past or (notifier.wait_past if notifier is not None else None)
        self._specs: OrderedDict[tuple[str, int], TaskSpec] = OrderedDict()
        # worker id -> (session id, generation, where its walk resumes); oldest first
        self._cursors: OrderedDict[str, tuple[str, int, QueuedCandidate]] = OrderedDict()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        # Herd avoidance (``pull``): the "runs" count before the latest pass that left the queue
        # empty (None: the latest pass left something), and the turn woken pulls take to look.
        self._empty_at: int | None = None
        self._turn = threading.Lock()
        self.herd_skips = 0  # woken pulls that did not need to look (tests, docs/cluster.md)

    def close(self) -> None:
        """Long-polls in flight answer at once (graceful shutdown)."""
        self._closing.set()
        notifier = getattr(self._db, "notifier", None)
        if notifier is not None:
            notifier.notify(channels.RUNS)

    def _spec(self, tx: Transaction, task_id: str, revision: int) -> TaskSpec:
        """The revision's spec, cached; a miss reads it in the caller's transaction (never a second
        connection while the pull holds one: a full pool would wait on itself)."""
        key = (task_id, revision)
        with self._lock:
            cached = self._specs.get(key)
            if cached is not None:
                self._specs.move_to_end(key)
                return cached
        spec = build_spec(get_revision(tx, task_id, revision).spec)
        with self._lock:
            self._specs[key] = spec
            while len(self._specs) > SPEC_CACHE_SIZE:
                self._specs.popitem(last=False)
        return spec

    # -- the per-session fair scan cursor ----------------------------------------------------------

    def resume_cursor(self, req: PullRequest) -> QueuedCandidate | None:
        """Where this session's walk stopped on this replica (None: the head of the queue)."""
        with self._lock:
            entry = self._cursors.get(req.worker_id)
        if entry is None or entry[:2] != (req.session_id, req.generation):
            return None  # another session of this worker walks from the head
        return entry[2]

    def _remember(self, req: PullRequest, result: PullResult) -> None:
        """A budget-stopped pass saves where it stopped; an offer, or a pass that reached the end of
        the queue, sends the next one back to the head (priority order first). Anything else (no
        free slot, draining) leaves the walk where it was."""
        with self._lock:
            if result.truncated and result.cursor is not None:
                self._cursors[req.worker_id] = (req.session_id, req.generation, result.cursor)
                self._cursors.move_to_end(req.worker_id)
                while len(self._cursors) > MAX_SCAN_CURSORS:
                    self._cursors.popitem(last=False)
            elif result.offer is not None or result.walked_to_end:
                self._cursors.pop(req.worker_id, None)

    # -- one bounded pass --------------------------------------------------------------------------

    def pull_once(
        self, req: PullRequest, cursor: QueuedCandidate | None = None, *, replay_only: bool = False
    ) -> PullResult:
        """One bounded pass from ``cursor`` (None: the head of the queue). ``replay_only``: only
        re-deliver the live lease of this pair, never claim (a restarted worker resuming what it
        journaled); nothing live answers ``not_live``.

        A pass is one write transaction per page of candidates: the first also checks the session,
        looks for this pair's live lease and reads the worker's free slots, so a pull that claims
        from the first page costs one transaction. The worker's registry row is locked first, so
        every pull of this worker, on any replica, serialises there, and the second of two
        identical retries finds the first one's lease."""
        validate_request(req)
        digests = [leases.lease_digest(pair.lease_token) for pair in req.pairs()]

        def first(tx: Transaction) -> tuple[PullResult, WorkerSnapshot | None, QueuedCandidate | None]:
            if not replay_only and worker_repo.lock_worker(tx, req.worker_id) is None:
                _check_session(tx, req)  # names why: unregistered, replaced, offline
                return PullResult(reason="draining"), None, cursor
            _check_session(tx, req)
            live = _find_live(tx, req.worker_id, digests)
            if live:
                return _replayed(tx, req, live, self._shared), None, cursor
            if replay_only:
                return PullResult(reason="not_live"), None, cursor
            snap = workers.snapshot_one(tx, worker_id=req.worker_id)
            if not snap:
                return PullResult(reason="draining"), None, cursor  # online is required for new claims
            if snap[0].session_id != req.session_id or snap[0].generation != req.generation:
                raise FenceConflict(reason="worker_session_mismatch")
            if snap[0].free_slots <= 0:
                return PullResult(reason="no_capacity"), None, cursor
            result, last = self._page(tx, req, snap[0], digests, cursor, 0, locked=True)
            return result, snap[0], last

        result, snapshot, cursor = self._db.transaction(first, write=not replay_only)
        page_no = 1
        while result.reason == "next_page" and snapshot is not None:
            result, cursor = self._db.transaction(
                partial(
                    self._page, req=req, snapshot=snapshot, digests=digests, cursor=cursor, page_no=page_no
                )
            )
            page_no += 1
        return result

    def _page(
        self,
        tx: Transaction,
        req: PullRequest,
        snapshot: WorkerSnapshot,
        digests: list[str],
        cursor: QueuedCandidate | None,
        page_no: int,
        locked: bool = False,
    ) -> tuple[PullResult, QueuedCandidate | None]:
        """One page of candidates from ``cursor``, placed and claimed in ``tx``: offers (up to one
        per pair and per free slot), the end of the walk, the end of the budget, or ``next_page``
        (with where it stopped)."""
        from_head = cursor is None and page_no == 0
        page = self._candidates(tx, cursor)
        # Only a short first page read from the head shows the whole queue.
        whole = from_head and len(page) < self.budget.candidate_page
        reason = "no_candidates"
        pairs = req.pairs()
        want = max(1, min(len(pairs), snapshot.free_slots))
        offers: list[Offer] = []
        for cand in page:
            cursor = cand
            if cand.attempt_id is None or cand.attempt_status != "claimed":
                reason, whole = "claim_raced", False
                continue
            try:
                task_spec = self._spec(tx, cand.task_id, cand.task_revision)
                placement = effective_placement(cand.executor_type, task_spec.require, task_spec.prefer)
                if not rank(placement, [snapshot]):
                    reason, whole = "no_match", False
                    continue
                shared = None if self._shared is None else self._shared.in_transaction(tx)
                # a script task reads its script in this same transaction (docs/scripts.md)
                spec = candidate_plan(task_spec, cand, cand.attempt_id, shared, tx=tx)
            except Ql3Error:
                reason, whole = "plans_unavailable", False
                continue
            pair = pairs[len(offers)]
            outcome = self._claim(
                tx, req=req, cand=cand, attempt_id=cand.attempt_id, pair=pair, digests=digests, locked=locked
            )
            locked = True  # the first claim took the lock and looked: the rest of this unit holds it
            if isinstance(outcome, PullResult):
                return outcome, cursor  # a retry whose first pull claimed: re-delivered, nothing more
            if outcome.status == "claimed" and outcome.lease is not None:
                offers.append(_offer(outcome.lease, pair, spec))
                if len(offers) >= want:
                    last = whole and cand is page[-1]  # nothing skipped before it, nothing after it
                    return _claimed(offers, queue_empty=last), cursor
                continue
            if outcome.status in ("worker_unavailable", "capacity_exhausted"):
                if offers:
                    return _claimed(offers, queue_empty=False), cursor
                status = "no_capacity" if outcome.status == "capacity_exhausted" else "draining"
                return PullResult(reason=status), cursor
            reason, whole = "claim_raced", False
        if offers:  # the page ended before every pair was used
            return _claimed(offers, queue_empty=whole), cursor
        if len(page) < self.budget.candidate_page:
            return PullResult(reason=reason, walked_to_end=True, queue_empty=whole), cursor
        if page_no >= self.budget.candidate_pages - 1:
            return PullResult(reason="scan_budget_exhausted", truncated=True, cursor=cursor), cursor
        return PullResult(reason="next_page"), cursor

    def _candidates(self, tx: Transaction, cursor: QueuedCandidate | None) -> list[QueuedCandidate]:
        after = None if cursor is None else (cursor.priority, cursor.queued_at_ms, cursor.run_id)
        return run_repo.queued_candidates(tx, after=after, limit=self.budget.candidate_page)

    def _claim(
        self,
        tx: Transaction,
        *,
        req: PullRequest,
        cand: QueuedCandidate,
        attempt_id: str,
        pair: PullPair,
        digests: list[str],
        locked: bool = False,
    ) -> lease_claims.RunClaim | PullResult:
        # The worker's registry row is locked first: every pull of this worker, on any replica,
        # serialises here, and the second of two identical retries finds the first one's lease.
        # ``locked``: this transaction took the lock and looked for the pair's lease already.
        if not locked:
            if worker_repo.lock_worker(tx, req.worker_id) is None:
                return lease_claims.RunClaim(status="worker_unavailable")
            live = _find_live(tx, req.worker_id, digests)
            if live:
                return _replayed(tx, req, live, self._shared)
        return lease_claims.claim(
            tx,
            run_id=cand.run_id,
            attempt_id=attempt_id,
            worker_id=req.worker_id,
            session_id=req.session_id,
            worker_generation=req.generation,
            token_for_generation=lambda generation: pair.lease_token,
            lease_ms=self.budget.lease_ms,
        )

    # -- the long-poll -----------------------------------------------------------------------------

    def _pass(self, req: PullRequest, marks: dict[str, int]) -> PullResult:
        """One pass from this session's cursor; notes whether it left the queue empty as of the
        "runs" count read before it (any later run raises that count, so the note goes stale)."""
        result = self.pull_once(req, self.resume_cursor(req))
        self._remember(req, result)
        with self._lock:
            self._empty_at = marks.get(channels.RUNS) if result.queue_empty else None
        return result

    def pull(
        self, req: PullRequest, *, wait_ms: int, replay_only: bool = False, fresh: bool = False
    ) -> PullResult:
        """Passes from where this session's walk stopped, at most ``1 + MAX_IMMEDIATE_RETRIES`` in a
        row; a walk still not at the end answers at once (the worker's next pull continues it), one
        that reached the end of the queue waits for a wake-up and looks again from the head.

        ``fresh``: the worker never sent these pairs before, so there is nothing to re-deliver; such
        a pull skips its first pass, as a woken one does, when no "runs" event came since a pass
        found the queue empty (a worker that just took the last run asks again without a
        transaction). A retried pair is never fresh: its first pass finds what it claimed."""
        if isinstance(wait_ms, bool) or not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ValidationFailed(f"waitMs must be 0-{MAX_WAIT_MS}", field="waitMs")
        if replay_only:
            return self.pull_once(req, replay_only=True)
        deadline = time.monotonic() + wait_ms / 1000
        immediate = 0
        woken = False
        result = PullResult(reason="no_candidates", walked_to_end=True)
        while True:
            if (woken or fresh) and self._counters is not None:
                # Woken pulls on this replica look one at a time, so the herd a new run wakes costs
                # one pass, not one per waiting worker: the first takes it, the rest see that no
                # "runs" event came since a pass found the queue empty and wait again.
                with self._turn:
                    marks = self._counters(WAKE_CHANNELS)
                    if self._empty_at is not None and self._empty_at == marks.get(channels.RUNS):
                        self.herd_skips += 1
                    else:
                        result = self._pass(req, marks)
            else:
                marks = self._counters(WAKE_CHANNELS) if self._counters is not None else {}
                result = self._pass(req, marks)
            if result.offer is not None:
                return result
            if result.truncated and immediate < MAX_IMMEDIATE_RETRIES:
                immediate += 1  # a budget stopped the scan: continue behind it at once
                continue
            remaining = deadline - time.monotonic()
            if result.truncated or remaining <= 0 or self._closing.is_set() or self._wait_past is None:
                return result
            immediate = 0
            self._wait_past(marks, remaining)
            woken = True
            if self._closing.is_set():
                return result
