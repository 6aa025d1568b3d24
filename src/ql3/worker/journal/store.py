"""``WorkerJournal``: the single-owner store of the journal; concurrent writes share a commit."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Generic, TypeVar, get_args

from ql3.domain.journal import (
    AUDIT_CLASSES,
    RECONCILE_CLASSES,
    REFRESHABLE_STATES,
    STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    AcceptResult,
    AuditClass,
    JournalAudit,
    JournalBudgetExceeded,
    JournalClosed,
    JournalCompromised,
    JournalConflict,
    JournalError,
    JournalFull,
    JournalInvalid,
    JournalOffer,
    JournalRecord,
    JournalState,
    JournalUnavailable,
    RecoveryReason,
    resumable,
)
from ql3.worker.journal.files import acquire_lock, ensure_private_dir, release_lock
from ql3.worker.journal.schema import (
    COUNT_ACTIVE,
    DELETE,
    DELETE_SETTLED,
    INSERT,
    SELECT_ANY_AFTER,
    SELECT_AUDIT_PAGE,
    SELECT_BY_ATTEMPT,
    SELECT_EXPIRED,
    SELECT_KEYS,
    SELECT_ONE,
    SELECT_PAGE,
    SELECT_RECONCILE_AFTER,
    SELECT_RECONCILE_PAGE,
    UPDATE,
    UPDATE_OFFER,
    connect,
    record_of,
    rollback,
    row_of,
)
from ql3.worker.journal.seal import TokenSeal, key_path_for
from ql3.worker.journal.validation import (
    DEFAULT_AUDIT_MAX_PAGES,
    DEFAULT_AUDIT_PAGE_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_RETENTION_LIMIT,
    KEY_INDEX_LIMIT,
    MAX_CAPACITY,
    MAX_PAGE_LIMIT,
    MAX_RETENTION_AGE_MS,
    MAX_RETENTION_LIMIT,
    MIN_RETENTION_AGE_MS,
    check_budget,
    check_int,
    check_step,
    check_via,
    validate_offer,
)

_T = TypeVar("_T")


class WorkerJournal:
    """The single-owner local journal of one worker host.

    Every method is thread-safe (one lock, one connection) and every write is committed in a short
    ``BEGIN IMMEDIATE`` transaction, which it shares with the writes of other threads that arrived
    while the previous one was committing (group commit, ``_write``): each keeps its own checks and
    errors. Every write survives a crash of the process once it returned; the ``launching`` barrier
    (written before every spawn) returns only after a commit with ``synchronous=FULL``, so it and
    every write before it also survive power loss. Later states are re-derivable after a power loss:
    the process died with the machine, and its handle proves that.

    The records that are not settled are also kept in memory, exactly as committed, so a record is
    read from the file (and its token unsealed) once, not at every step of its attempt. The memory is
    coherent because this instance is the file's only writer (the owner lock) and updates it only
    after a commit, under the same lock; every write still goes to the file first, and each update
    keeps its compare-and-set on revision and state in SQL, so a stale entry could only make a write
    fail, never let one through.
    Build it with :meth:`open`; release it with :meth:`close`.
    """

    def __init__(
        self,
        *,
        conn: sqlite3.Connection,
        lock_fd: int,
        lock_path: Path,
        clock: Callable[[], int],
        capacity: int,
        seal: TokenSeal,
    ) -> None:
        self._seal = seal
        self._conn = conn
        self._lock_fd = lock_fd
        self._lock_path = lock_path
        # What the descriptor holds never changes: its inode is taken once, the name's on every call.
        # A descriptor that cannot be stat'ed now is no proof of ownership either.
        try:
            self._lock_inode: os.stat_result | None = os.fstat(lock_fd)
        except OSError:
            self._lock_inode = None
        self._clock = clock
        self._capacity = capacity
        self._mutex = threading.Lock()
        self._closed = False
        self._compromised = False
        # offer id -> the committed record, for records not settled (bounded like the active records:
        # settled ones are dropped, and so is every record the file no longer holds). Changed only under
        # ``_mutex``; ``_staged`` holds what the open transaction wrote, applied once it commits.
        self._records: dict[str, JournalRecord] = {}
        self._staged: dict[str, JournalRecord | None] = {}
        # What the earlier writes of the group being committed staged (``_write``), applied with it.
        self._group: dict[str, JournalRecord | None] = {}
        self._group_keys: dict[str, tuple[str, int, int] | None] = {}
        # Group commit: writes queued while a group commits; ``_committing`` while one does.
        self._arrived = threading.Condition(threading.Lock())
        self._queue: list[_Write[Any]] = []
        self._committing = False
        # Whether the connection is at synchronous=FULL now (it opens at NORMAL, schema.connect).
        self._full = False
        # Every row's keys (offer id -> attempt id, lease generation, accepted at), loaded at open: a
        # miss in it is an answer ("no such record") without a read of the file. None when the file
        # holds more than KEY_INDEX_LIMIT rows: then misses are read from the file, as before.
        self._keys: dict[str, tuple[str, int, int]] | None = None
        self._by_attempt: dict[str, set[str]] = {}
        self._staged_keys: dict[str, tuple[str, int, int] | None] = {}

    @classmethod
    def open(cls, path: Path, *, clock: Callable[[], int], capacity: int = DEFAULT_CAPACITY) -> WorkerJournal:
        """Open (creating if missing) the journal at ``path`` and take its single-owner lock.

        Raises ``JournalInvalid`` (a ``ValueError``) for a capacity outside 1..1024, ``JournalLocked``
        when another instance in any process owns the file, ``JournalUnavailable`` when the file
        cannot be used as a journal.
        """
        check_int(capacity, 1, MAX_CAPACITY, "capacity_out_of_range")
        path = Path(path)
        ensure_private_dir(path.parent)
        lock_path = path.with_name(path.name + ".lock")
        lock_fd = acquire_lock(lock_path)
        try:
            seal = TokenSeal.load(key_path_for(path))
            conn = connect(path, seal)
        except BaseException:
            release_lock(lock_fd)
            raise
        journal = cls(
            conn=conn, lock_fd=lock_fd, lock_path=lock_path, clock=clock, capacity=capacity, seal=seal
        )
        try:
            journal._load_keys()
        except BaseException:
            journal.close()
            raise
        return journal

    def _load_keys(self) -> None:
        with self._reading() as conn:
            rows = conn.execute(SELECT_KEYS, (KEY_INDEX_LIMIT + 1,)).fetchall()
            if len(rows) > KEY_INDEX_LIMIT:
                return  # too many rows to index: misses are read from the file
            self._keys = {}
            self._by_attempt = {}
            for offer_id, attempt_id, lease_generation, accepted_at_ms in rows:
                self._index(offer_id, (attempt_id, lease_generation, accepted_at_ms))

    @property
    def capacity(self) -> int:
        return self._capacity

    def close(self) -> None:
        """Close the file and release the lock; idempotent. Later calls raise ``JournalClosed``."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._records.clear()
            self._keys = None
            self._by_attempt.clear()
            try:
                self._conn.close()
            finally:
                release_lock(self._lock_fd)

    def __enter__(self) -> WorkerJournal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def accept(self, offer: JournalOffer) -> AcceptResult:
        """Record a received offer as ``accepted``, deduplicating by ``offer_id``.

        A redelivery with the same run, attempt, lease generation and spec digest returns the stored
        record (``created=False``); a ``lease_recovery`` redelivery may replace the stored offer while
        nothing has been spawned. Any identity drift raises ``JournalConflict`` before a write. A new
        offer when ``capacity`` records are still active raises ``JournalFull``; nothing is evicted.
        """
        validate_offer(offer)

        def write(conn: sqlite3.Connection) -> AcceptResult:
            existing = self._known(offer.offer_id)
            if existing is None and not self._absent(offer.offer_id):
                row = conn.execute(SELECT_ONE, (offer.offer_id,)).fetchone()
                existing = None if row is None else self._read(row)
            if existing is not None:
                return AcceptResult(record=self._redelivered(conn, existing, offer), created=False)
            (active,) = conn.execute(COUNT_ACTIVE).fetchone()
            if active >= self._capacity:
                raise JournalFull()
            now = self._now()
            record = JournalRecord(
                offer_id=offer.offer_id,
                run_id=offer.run_id,
                attempt_id=offer.attempt_id,
                lease_generation=offer.lease_generation,
                execution_spec_digest=offer.execution_spec_digest,
                delivery_kind=offer.delivery_kind,
                state="accepted",
                revision=1,
                offer_json=offer.offer_json,
                accepted_at_ms=now,
                updated_at_ms=now,
                lease_token=offer.lease_token,
            )
            conn.execute(INSERT, (*row_of(record), self._sealed(record.offer_id, record.lease_token)))
            self._stage(record)
            self._staged_keys[record.offer_id] = (
                record.attempt_id,
                record.lease_generation,
                record.accepted_at_ms,
            )
            return AcceptResult(record=record, created=True)

        return self._write(write)

    def advance(
        self,
        offer_id: str,
        *,
        expected_revision: int,
        to_state: JournalState,
        completion_callback_sequence: int | None = None,
        completion_token_digest: str | None = None,
        log_artifact_id: str | None = None,
        executor_handle: str | None = None,
        executor_started_at_ms: int | None = None,
        recovery_reason: RecoveryReason | None = None,
        via: JournalState | None = None,
        prune: bool = False,
    ) -> JournalRecord:
        """Move one record forward by exactly one transition, CAS on ``expected_revision``.

        ``launching`` requires the callback sequence, the sha256 hex of the completion token and the
        log artifact id; ``started`` requires the executor handle and start time; ``recovery_required``
        requires a reason; ``completion_acknowledged`` stamps its time. Other fields are refused.
        ``via`` first passes through that state (one that takes no fields), in the same transaction:
        two transitions, two revisions, one commit. ``prune`` (only towards a settled state) deletes
        the record in the same transaction, as ``prune`` would right after; the settled record is
        returned. Raises ``JournalInvalid`` for bad fields, ``JournalConflict`` (``details["reason"]``
        is ``not_found``, ``stale_revision`` or ``invalid_transition``) otherwise; nothing is written then.
        """
        check_via(via, to_state, prune=prune)
        check_step(
            to_state,
            expected_revision,
            completion_callback_sequence=completion_callback_sequence,
            completion_token_digest=completion_token_digest,
            log_artifact_id=log_artifact_id,
            executor_handle=executor_handle,
            executor_started_at_ms=executor_started_at_ms,
            recovery_reason=recovery_reason,
        )

        def write(conn: sqlite3.Connection) -> JournalRecord:
            current = self._known(offer_id)
            if current is None:
                row = conn.execute(SELECT_ONE, (offer_id,)).fetchone()
                if row is None:
                    raise JournalConflict(reason="not_found")
                current = self._read(row)
            if current.revision != expected_revision:
                raise JournalConflict(reason="stale_revision")
            path = (current.state, to_state) if via is None else (current.state, via, to_state)
            if any(b not in TRANSITIONS[a] for a, b in pairwise(path)) or not resumable(current, to_state):
                raise JournalConflict(reason="invalid_transition")
            now = self._now(floor=current.updated_at_ms)
            updated = JournalRecord(
                offer_id=current.offer_id,
                run_id=current.run_id,
                attempt_id=current.attempt_id,
                lease_generation=current.lease_generation,
                execution_spec_digest=current.execution_spec_digest,
                delivery_kind=current.delivery_kind,
                offer_json=current.offer_json,
                accepted_at_ms=current.accepted_at_ms,
                lease_token=current.lease_token,
                state=to_state,
                revision=current.revision + len(path) - 1,
                updated_at_ms=now,
                completion_callback_sequence=_keep(
                    completion_callback_sequence, current.completion_callback_sequence
                ),
                completion_token_digest=_keep(completion_token_digest, current.completion_token_digest),
                log_artifact_id=_keep(log_artifact_id, current.log_artifact_id),
                executor_handle=_keep(executor_handle, current.executor_handle),
                executor_started_at_ms=_keep(executor_started_at_ms, current.executor_started_at_ms),
                recovery_reason=_keep(recovery_reason, current.recovery_reason),
                completion_acknowledged_at_ms=(
                    now if to_state == "completion_acknowledged" else current.completion_acknowledged_at_ms
                ),
            )
            if prune:
                # Settled and deleted at once: nothing is left to recover, and the delete is as
                # conditional on the revision and state read as the update it replaces.
                if conn.execute(DELETE, (current.offer_id, current.revision, current.state)).rowcount != 1:
                    self._records.pop(current.offer_id, None)
                    raise JournalConflict(reason="stale_revision")
                self._staged_keys[current.offer_id] = None
            else:
                self._update(conn, current, updated)
            self._stage(updated)
            return updated

        # The crash barrier: its commit is FULL-synchronous, whatever else shares it.
        return self._write(write, durable=to_state == "launching")

    def get(self, offer_id: str) -> JournalRecord | None:
        """The record of ``offer_id``, or None."""
        with self._mutex:
            self._owned_connection()  # closed, compromised or no longer the owner: refused as before
            known = self._records.get(offer_id)
            absent = known is None and self._keys is not None and offer_id not in self._keys
        if known is not None:
            return known  # what this owner last committed for it (see the class docstring)
        if absent:
            return None  # no such row: the index holds every row's keys
        with self._reading() as conn:
            row = conn.execute(SELECT_ONE, (offer_id,)).fetchone()
            return None if row is None else self._read(row)

    def find_by_attempt(self, attempt_id: str) -> JournalRecord | None:
        """The record of ``attempt_id`` with the highest lease generation (latest accepted), or None."""
        with self._mutex:
            self._owned_connection()
            keys = self._keys
            if keys is not None:
                offers = self._by_attempt.get(attempt_id)
                if not offers:
                    return None
                # The order of SELECT_BY_ATTEMPT: lease generation, then accepted at, then offer id.
                latest = max(offers, key=lambda o: (keys[o][1], keys[o][2], o))
                known = self._records.get(latest)
                if known is not None:
                    return known
        with self._reading() as conn:
            row = conn.execute(SELECT_BY_ATTEMPT, (attempt_id,)).fetchone()
            return None if row is None else self._read(row)

    def page(
        self,
        *,
        states: Collection[str] | None = None,
        after_offer_id: str = "",
        limit: int = MAX_PAGE_LIMIT,
    ) -> list[JournalRecord]:
        """Up to ``limit`` (1..64) records after ``after_offer_id`` in offer-id order, optionally by state."""
        check_int(limit, 1, MAX_PAGE_LIMIT, "limit_out_of_range")
        if not isinstance(after_offer_id, str) or len(after_offer_id) > 255:
            raise JournalInvalid(reason="cursor_invalid")
        states_json: str | None = None
        if states is not None:
            if isinstance(states, str) or not states or not set(states) <= STATES:
                raise JournalInvalid(reason="states_invalid")
            states_json = json.dumps(sorted(states))
        with self._reading() as conn:
            rows = conn.execute(
                SELECT_PAGE, {"after": after_offer_id, "states": states_json, "limit": limit}
            ).fetchall()
            return [self._read(row) for row in rows]

    def audit(
        self, *, page_size: int = DEFAULT_AUDIT_PAGE_SIZE, max_pages: int = DEFAULT_AUDIT_MAX_PAGES
    ) -> JournalAudit:
        """Classify every record without writing. More records than ``page_size * max_pages``
        (hard 64 x 16) raises ``JournalBudgetExceeded``: no partial audit is ever returned."""
        check_budget(page_size, max_pages)
        counts: dict[AuditClass, int] = dict.fromkeys(get_args(AuditClass), 0)
        pending: list[str] = []
        with self._reading() as conn:
            after = ""
            for _ in range(max_pages):
                rows = conn.execute(SELECT_AUDIT_PAGE, (after, page_size)).fetchall()
                for offer_id, state in rows:
                    audit_class = AUDIT_CLASSES.get(state)
                    if audit_class is None:
                        raise JournalUnavailable(reason="row_invalid")
                    counts[audit_class] += 1
                    if audit_class in RECONCILE_CLASSES:
                        pending.append(offer_id)
                if len(rows) < page_size:
                    break
                after = rows[-1][0]
            else:
                if conn.execute(SELECT_ANY_AFTER, (after,)).fetchone() is not None:
                    raise JournalBudgetExceeded()
        return JournalAudit(
            total=sum(counts.values()),
            counts=MappingProxyType(counts),
            needs_reconciliation=tuple(pending),
        )

    def startup_recovery(
        self, *, page_size: int = DEFAULT_AUDIT_PAGE_SIZE, max_pages: int = DEFAULT_AUDIT_MAX_PAGES
    ) -> list[JournalRecord]:
        """Turn every ``launching`` record into ``recovery_required: launch_outcome_unknown`` and
        return the records the caller must reconcile (``started``, ``running_acknowledged``,
        ``recovery_required``), in offer-id order.

        One transaction: more such records than the budget raises ``JournalBudgetExceeded`` before
        any write.
        """
        check_budget(page_size, max_pages)

        def write(conn: sqlite3.Connection) -> list[JournalRecord]:
            found: list[JournalRecord] = []
            after = ""
            for _ in range(max_pages):
                rows = conn.execute(SELECT_RECONCILE_PAGE, (after, page_size)).fetchall()
                found.extend(self._read(row) for row in rows)
                if len(rows) < page_size:
                    break
                after = found[-1].offer_id
            else:
                if conn.execute(SELECT_RECONCILE_AFTER, (after,)).fetchone() is not None:
                    raise JournalBudgetExceeded()
            result: list[JournalRecord] = []
            for record in found:
                if record.state == "launching":
                    recovered = replace(
                        record,
                        state="recovery_required",
                        recovery_reason="launch_outcome_unknown",
                        revision=record.revision + 1,
                        updated_at_ms=self._now(floor=record.updated_at_ms),
                    )
                    self._update(conn, record, recovered)
                    self._stage(recovered)
                    record = recovered
                result.append(record)
            return result

        # Several updates: a conflict in the middle must undo the earlier ones of this call alone.
        return self._write(write, savepoint=True)

    def retention(self, *, older_than_ms: int, limit: int = DEFAULT_RETENTION_LIMIT) -> int:
        """Delete at most ``limit`` (1..64) settled records (``completion_acknowledged``,
        ``start_failure_acknowledged``) not updated for ``older_than_ms`` (1 min..30 d).

        Active records are never deleted; each delete is conditional on the revision read.
        Returns how many rows were deleted.
        """
        check_int(older_than_ms, MIN_RETENTION_AGE_MS, MAX_RETENTION_AGE_MS, "retention_age_out_of_range")
        check_int(limit, 1, MAX_RETENTION_LIMIT, "limit_out_of_range")

        def write(conn: sqlite3.Connection) -> int:
            cutoff = self._now() - older_than_ms
            deleted = 0
            for offer_id, revision, state in conn.execute(SELECT_EXPIRED, (cutoff, limit)).fetchall():
                if conn.execute(DELETE, (offer_id, revision, state)).rowcount == 1:
                    deleted += 1
                    self._staged[offer_id] = None
                    self._staged_keys[offer_id] = None
            return deleted

        return self._write(write)

    def prune(self, offer_id: str) -> bool:
        """Delete one settled record now: ``completion_acknowledged``, ``start_failure_acknowledged``, or
        ``recovery_required`` once the control plane holds the outcome (the caller knows when).

        In-flight records are never deleted. Returns True when a row was deleted.
        """

        def write(conn: sqlite3.Connection) -> bool:
            deleted: bool = conn.execute(DELETE_SETTLED, (offer_id,)).rowcount == 1
            if deleted:
                self._staged[offer_id] = None
                self._staged_keys[offer_id] = None
            return deleted

        return self._write(write)

    def _redelivered(
        self, conn: sqlite3.Connection, existing: JournalRecord, offer: JournalOffer
    ) -> JournalRecord:
        if (
            existing.run_id != offer.run_id
            or existing.attempt_id != offer.attempt_id
            or existing.lease_generation != offer.lease_generation
            or existing.execution_spec_digest != offer.execution_spec_digest
        ):
            raise JournalConflict(reason="identity_mismatch")
        if (
            offer.delivery_kind != "lease_recovery"
            or existing.state not in REFRESHABLE_STATES
            or (existing.offer_json, existing.lease_token) == (offer.offer_json, offer.lease_token)
        ):
            return existing
        now = self._now(floor=existing.updated_at_ms)
        sealed = self._sealed(existing.offer_id, offer.lease_token)
        cursor = conn.execute(
            UPDATE_OFFER,
            (offer.offer_json, sealed, now, existing.offer_id, existing.revision, existing.state),
        )
        if cursor.rowcount != 1:
            self._records.pop(existing.offer_id, None)
            raise JournalConflict(reason="stale_revision")
        refreshed = replace(
            existing,
            offer_json=offer.offer_json,
            lease_token=offer.lease_token,
            revision=existing.revision + 1,
            updated_at_ms=now,
        )
        self._stage(refreshed)
        return refreshed

    def _sealed(self, offer_id: str, token: str | None) -> str | None:
        return None if token is None else self._seal.seal(offer_id, token)

    def _read(self, row: tuple[Any, ...]) -> JournalRecord:
        known = self._known(row[0])
        if known is not None and (known.revision, known.state) == (row[7], row[6]):
            return known  # the row as this owner committed it: already validated and unsealed
        record = self._unsealed(row)
        self._stage(record)
        return record

    def _unsealed(self, row: tuple[Any, ...]) -> JournalRecord:
        record = record_of(row)
        sealed = row[18]
        if sealed is None:
            return record
        if not isinstance(sealed, str):
            raise JournalUnavailable(reason="row_invalid")
        return replace(record, lease_token=self._seal.unseal(record.offer_id, sealed))

    def _update(self, conn: sqlite3.Connection, current: JournalRecord, updated: JournalRecord) -> None:
        cursor = conn.execute(
            UPDATE,
            (
                updated.state,
                updated.revision,
                updated.updated_at_ms,
                updated.executor_started_at_ms,
                updated.log_artifact_id,
                updated.completion_callback_sequence,
                updated.completion_token_digest,
                updated.executor_handle,
                updated.recovery_reason,
                updated.completion_acknowledged_at_ms,
                current.offer_id,
                current.revision,
                current.state,
            ),
        )
        if cursor.rowcount != 1:
            self._records.pop(current.offer_id, None)  # the memory was behind the file: read it again
            raise JournalConflict(reason="stale_revision")

    def _index(self, offer_id: str, key: tuple[str, int, int] | None) -> None:
        """Add (or, with None, remove) one row's keys; past KEY_INDEX_LIMIT rows the index is dropped."""
        keys = self._keys
        if keys is None:
            return
        old = keys.pop(offer_id, None)
        if old is not None:
            siblings = self._by_attempt.get(old[0])
            if siblings is not None:
                siblings.discard(offer_id)
                if not siblings:
                    del self._by_attempt[old[0]]
        if key is None:
            return
        if len(keys) >= KEY_INDEX_LIMIT:
            self._keys = None  # bounded memory: from now on misses are read from the file
            self._by_attempt = {}
            return
        keys[offer_id] = key
        self._by_attempt.setdefault(key[0], set()).add(offer_id)

    def _stage(self, record: JournalRecord) -> None:
        """Remember ``record`` once this write commits; settled records are not kept."""
        self._staged[record.offer_id] = None if record.state in TERMINAL_STATES else record

    def _now(self, *, floor: int = 0) -> int:
        now = self._clock()
        if isinstance(now, bool) or not isinstance(now, int) or now < 0:
            raise JournalInvalid(reason="clock_invalid")
        # A clock stepping backwards must not make a record look older than its last write.
        return max(now, floor)

    def _known(self, offer_id: str) -> JournalRecord | None:
        """The record as the running transaction sees it before a write: what the earlier writes of
        its group staged, else what is committed (None: read the file)."""
        if offer_id in self._group:
            return self._group[offer_id]
        return self._records.get(offer_id)

    def _absent(self, offer_id: str) -> bool:
        """True when the key index proves the file holds no row of ``offer_id`` (as the running
        transaction sees it), so nothing needs to be read; False when only the file can tell."""
        if offer_id in self._group_keys:
            return self._group_keys[offer_id] is None
        return self._keys is not None and offer_id not in self._keys

    def _apply(
        self, records: dict[str, JournalRecord | None], keys: dict[str, tuple[str, int, int] | None]
    ) -> None:
        for offer_id, record in records.items():
            if record is None:
                self._records.pop(offer_id, None)
            else:
                self._records[offer_id] = record
        for offer_id, key in keys.items():
            self._index(offer_id, key)

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """One read-only transaction; the records it read from the file are remembered once it ends."""
        with self._mutex:
            conn = self._owned_connection()
            self._staged, self._staged_keys = {}, {}
            try:
                conn.execute("BEGIN")
                yield conn
                conn.execute("COMMIT")
                self._apply(self._staged, self._staged_keys)
            except sqlite3.Error as exc:
                rollback(conn)
                raise JournalUnavailable() from exc
            except BaseException:
                rollback(conn)
                raise
            finally:
                self._staged, self._staged_keys = {}, {}

    def _write(
        self, op: Callable[[sqlite3.Connection], _T], *, durable: bool = False, savepoint: bool = False
    ) -> _T:
        """Run ``op`` in a write transaction, sharing it (group commit) with the writes that arrive
        while another group is committing; returns ``op``'s value or raises its own error.

        The first writer to find no commit in flight leads: it takes every queued write and runs them
        in arrival order in ONE ``BEGIN IMMEDIATE`` transaction and one COMMIT (FULL-synchronous when
        any of them is ``durable``), then wakes the others with their own outcomes. A writer alone
        leads at once: nothing waits for company. Each write keeps its own checks and its own errors:
        ``op`` must raise only before its single write statement (every compare-and-set here is
        checked from memory first, and a refused SQL one writes no row), or set ``savepoint`` when it
        writes several rows. Any other error than a ``JournalError`` (a SQLite error), or a failed
        COMMIT, fails every write of the group.
        """
        write = _Write(op, durable=durable, savepoint=savepoint)
        group: list[_Write[Any]] = []
        with self._arrived:
            self._queue.append(write)
            while self._committing and not write.done:
                self._arrived.wait()  # woken when the group in flight has committed (or failed)
            lead = not write.done
            if lead:
                self._committing = True
                group = self._queue[:]
                self._queue.clear()
        if lead:
            try:
                self._commit_group(group)
            finally:
                with self._arrived:
                    for member in group:
                        member.done = True
                    self._committing = False
                    self._arrived.notify_all()
        return write.result()

    def _commit_group(self, group: list[_Write[Any]]) -> None:
        """One transaction for every write of ``group``; each gets its outcome (see ``_write``)."""
        with self._mutex:
            try:
                conn = self._owned_connection()
            except JournalError as exc:
                for write in group:
                    write.error = copy.copy(exc)
                return
            durable = any(write.durable for write in group)
            try:
                if durable != self._full:
                    # The crash barrier: FULL fsyncs the WAL (and every earlier frame) at this commit.
                    # The level stays until a group needs the other one (no pragma pair per barrier).
                    conn.execute("PRAGMA synchronous = FULL" if durable else "PRAGMA synchronous = NORMAL")
                    self._full = durable
                conn.execute("BEGIN IMMEDIATE")
                for write in group:
                    self._run(conn, write)
                conn.execute("COMMIT")
            except BaseException as exc:
                rollback(conn)
                for write in group:
                    if write.error is None:  # a write refused on its own stays refused for its reason
                        write.outcome = None
                        write.error = JournalUnavailable()
                        write.error.__cause__ = exc
                if not isinstance(exc, sqlite3.Error):
                    raise
                return
            else:
                # Only what is committed reaches the memory, and before the lock is released.
                self._apply(self._group, self._group_keys)
            finally:
                self._staged, self._staged_keys = {}, {}
                self._group, self._group_keys = {}, {}

    def _run(self, conn: sqlite3.Connection, write: _Write[Any]) -> None:
        """One write of a group: its staging joins the group's only when it succeeds."""
        self._staged, self._staged_keys = {}, {}
        if write.savepoint:
            conn.execute("SAVEPOINT journal_write")
        try:
            value = write.op(conn)
        except JournalError as exc:
            # This write refused (a conflict, a full journal, a bad clock): it alone fails. Anything
            # else (a SQLite error: the file failed, not this write) rolls the whole group back.
            if write.savepoint:
                conn.execute("ROLLBACK TO journal_write")
                conn.execute("RELEASE journal_write")
            write.error = exc
            return
        if write.savepoint:
            conn.execute("RELEASE journal_write")
        write.outcome = (value,)
        self._group.update(self._staged)
        self._group_keys.update(self._staged_keys)

    def _owned_connection(self) -> sqlite3.Connection:
        if self._closed:
            raise JournalClosed()
        if self._compromised:
            raise JournalCompromised()
        # flock protects an inode, not a name: if the lock file was removed or replaced, a second
        # owner may already hold the new one, so this instance stops for good.
        try:
            owned = self._lock_inode is not None and os.path.samestat(
                os.stat(self._lock_path), self._lock_inode
            )
        except OSError:
            owned = False
        if not owned:
            self._compromised = True
            raise JournalCompromised()
        return self._conn


class _Write(Generic[_T]):
    """One queued write of a group commit and, once its group ended, its outcome."""

    __slots__ = ("done", "durable", "error", "op", "outcome", "savepoint")

    def __init__(self, op: Callable[[sqlite3.Connection], _T], *, durable: bool, savepoint: bool) -> None:
        self.op = op
        self.durable = durable
        self.savepoint = savepoint
        self.done = False  # its group ended (changed under ``_arrived``)
        self.outcome: tuple[_T] | None = None
        self.error: BaseException | None = None

    def result(self) -> _T:
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome[0]


def _keep(new: _T | None, old: _T | None) -> _T | None:
    return old if new is None else new
