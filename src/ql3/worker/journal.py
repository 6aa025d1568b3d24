"""The worker host's local crash barrier: one SQLite row per offer, committed before every effect.

The journal is local delivery state, not an authority (docs/contracts.md §3, docs/architecture.md
"The life of a run"). ``launching`` is committed before the executor is asked to spawn; a
``launching`` row found after a restart becomes ``recovery_required: launch_outcome_unknown`` and is
never spawned again.

The journal keeps only what recovery needs. ``offer_json`` is the offer as the worker stores it: the
fence without its lease token and the spec's identity and stop policy, never the command, the working
directory or environment values (the caller strips them, see ``worker.agent``). The lease token, which
a restarted worker needs to prove its authority, is kept only sealed (``lease_token_sealed``): encrypted
and authenticated with a worker-local key in ``<path>.key`` (32 random bytes, ``0600``), bound to its
offer id, so the journal file alone (a copy, a backup, a leaked WAL) holds no usable secret. A record
is pruned as soon as its attempt settles. The file is ``0600`` in a ``0700`` directory, and only one
owner (an ``flock`` on ``<path>.lock``) may use it at a time. The raw completion token is never stored,
only its sha256.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Final, Literal, TypeVar, get_args

from ql3.domain.errors import Ql3Error

JournalState = Literal[
    "accepted",
    "starting_acknowledged",
    "launching",
    "started",
    "running_acknowledged",
    "completion_acknowledged",
    "start_failed",
    "start_failure_acknowledged",
    "recovery_required",
]
DeliveryKind = Literal["new_claim", "lease_recovery"]
RecoveryReason = Literal[
    "launch_outcome_unknown",
    "control_plane_already_running",
    "control_plane_terminal",
    "lease_lost_local_execution_stopped",
    "lease_lost_local_execution_unverified",
    "process_exited_without_receipt",
]
AuditClass = Literal[
    "no_local_execution", "converged", "settled", "launch_reconciler", "execution_reconciler"
]

STATES: Final[frozenset[str]] = frozenset(get_args(JournalState))
DELIVERY_KINDS: Final[frozenset[str]] = frozenset(get_args(DeliveryKind))
RECOVERY_REASONS: Final[frozenset[str]] = frozenset(get_args(RecoveryReason))
TERMINAL_STATES: Final[frozenset[str]] = frozenset({"completion_acknowledged", "start_failure_acknowledged"})
IN_FLIGHT_STATES: Final[frozenset[str]] = frozenset(
    {"accepted", "starting_acknowledged", "launching", "started", "running_acknowledged"}
)
# A lease_recovery redelivery may refresh the stored offer only before anything was spawned.
_REFRESHABLE_STATES: Final[frozenset[str]] = frozenset({"accepted", "starting_acknowledged"})

AUDIT_CLASSES: Final[Mapping[str, AuditClass]] = MappingProxyType(
    {
        "accepted": "no_local_execution",
        "starting_acknowledged": "no_local_execution",
        "start_failed": "no_local_execution",
        "start_failure_acknowledged": "converged",
        "completion_acknowledged": "settled",
        "launching": "launch_reconciler",
        "recovery_required": "launch_reconciler",
        "started": "execution_reconciler",
        "running_acknowledged": "execution_reconciler",
    }
)
_RECONCILE_CLASSES: Final[frozenset[str]] = frozenset({"launch_reconciler", "execution_reconciler"})

_TRANSITIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "accepted": frozenset({"starting_acknowledged", "start_failed", "recovery_required"}),
        "starting_acknowledged": frozenset({"launching", "start_failed", "recovery_required"}),
        # An explicit executor rejection is a known outcome: nothing runs, so the start failed.
        "launching": frozenset({"started", "start_failed", "recovery_required"}),
        # A trusted receipt found before the running ACK completes the run directly.
        "started": frozenset({"running_acknowledged", "completion_acknowledged", "recovery_required"}),
        "running_acknowledged": frozenset({"completion_acknowledged", "recovery_required"}),
        "start_failed": frozenset({"start_failure_acknowledged"}),
        # Completion beats every recovery reason, the lease-lost ones included. ``started`` only
        # resolves an unknown launch outcome with the handle found afterwards (see ``advance``).
        "recovery_required": frozenset({"completion_acknowledged", "started"}),
        "completion_acknowledged": frozenset(),
        "start_failure_acknowledged": frozenset(),
    }
)
_REQUIRED_FIELDS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "launching": frozenset(
            {"completion_callback_sequence", "completion_token_digest", "log_artifact_id"}
        ),
        "started": frozenset({"executor_handle", "executor_started_at_ms"}),
        "recovery_required": frozenset({"recovery_reason"}),
    }
)

DEFAULT_CAPACITY: Final = 64
MAX_CAPACITY: Final = 1024
MAX_PAGE_LIMIT: Final = 64
DEFAULT_AUDIT_PAGE_SIZE: Final = 16
DEFAULT_AUDIT_MAX_PAGES: Final = 4
MAX_AUDIT_PAGES: Final = 16
DEFAULT_RETENTION_LIMIT: Final = 8
MAX_RETENTION_LIMIT: Final = 64
MIN_RETENTION_AGE_MS: Final = 60_000
MAX_RETENTION_AGE_MS: Final = 30 * 86_400_000
MAX_OFFER_JSON_BYTES: Final = 192 * 1024
SCHEMA_VERSION: Final = 2
KEY_BYTES: Final = 32
MAX_LEASE_TOKEN_BYTES: Final = 1024

_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
_DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")
_HANDLE_RE: Final = re.compile(r"[\x21-\x7e]{1,512}")
_MAX_INT64: Final = 2**63 - 1
_T = TypeVar("_T")


class JournalError(Ql3Error):
    """The worker journal failed."""

    code = "journal_error"


class JournalInvalid(JournalError, ValueError):
    """The journal request is invalid."""

    code = "journal_invalid"
    http_status = 422


class JournalConflict(JournalError):
    """The journal record does not match the expected identity, revision or state."""

    code = "journal_conflict"
    http_status = 409


class JournalFull(JournalError):
    """The worker journal is at capacity."""

    code = "journal_full"
    http_status = 503
    retryable = True


class JournalLocked(JournalError):
    """The worker journal is owned by another journal instance."""

    code = "journal_locked"
    http_status = 503
    retryable = True


class JournalBudgetExceeded(JournalError):
    """The worker journal holds more records than the scan budget allows."""

    code = "journal_budget_exceeded"


class JournalClosed(JournalError):
    """The worker journal is closed."""

    code = "journal_closed"


class JournalCompromised(JournalError):
    """The worker journal lost its single-owner lock and refuses every operation."""

    code = "journal_compromised"


class JournalUnavailable(JournalError):
    """The worker journal cannot be read or written."""

    code = "journal_unavailable"
    http_status = 503
    retryable = True


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalOffer:
    """An offer as received, already verified against the worker's session and lease."""

    offer_id: str
    run_id: str
    attempt_id: str
    lease_generation: int
    execution_spec_digest: str
    delivery_kind: DeliveryKind
    offer_json: str = field(repr=False)
    # The lease token: stored sealed, never in ``offer_json`` and never in a repr.
    lease_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalRecord:
    """One journal row: the offer, its local delivery state and the facts written on the way."""

    offer_id: str
    run_id: str
    attempt_id: str
    lease_generation: int
    execution_spec_digest: str
    delivery_kind: DeliveryKind
    state: JournalState
    revision: int
    offer_json: str = field(repr=False)
    accepted_at_ms: int
    updated_at_ms: int
    executor_started_at_ms: int | None = None
    log_artifact_id: str | None = None
    completion_callback_sequence: int | None = None
    completion_token_digest: str | None = field(default=None, repr=False)
    executor_handle: str | None = field(default=None, repr=False)
    recovery_reason: RecoveryReason | None = None
    completion_acknowledged_at_ms: int | None = None
    # Unsealed on read (the file holds only ``lease_token_sealed``).
    lease_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptResult:
    """The stored record and whether this call created it (False for a deduplicated redelivery)."""

    record: JournalRecord
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalAudit:
    """Read-only classification of every record; holds counts and offer ids only, never offers."""

    total: int
    counts: Mapping[AuditClass, int]
    needs_reconciliation: tuple[str, ...]


_COLUMNS: Final = (
    "offer_id, run_id, attempt_id, lease_generation, execution_spec_digest, delivery_kind, state, "
    "revision, offer_json, accepted_at_ms, updated_at_ms, executor_started_at_ms, log_artifact_id, "
    "completion_callback_sequence, completion_token_digest, executor_handle, recovery_reason, "
    "completion_acknowledged_at_ms, lease_token_sealed"
)
_SCHEMA: Final = (
    """
    CREATE TABLE journal (
      offer_id TEXT PRIMARY KEY,
      run_id TEXT NOT NULL,
      attempt_id TEXT NOT NULL,
      lease_generation INTEGER NOT NULL,
      execution_spec_digest TEXT NOT NULL,
      delivery_kind TEXT NOT NULL CHECK (delivery_kind IN ('new_claim', 'lease_recovery')),
      state TEXT NOT NULL CHECK (state IN ('accepted', 'starting_acknowledged', 'launching', 'started',
        'running_acknowledged', 'completion_acknowledged', 'start_failed', 'start_failure_acknowledged',
        'recovery_required')),
      revision INTEGER NOT NULL CHECK (revision >= 1),
      offer_json TEXT NOT NULL,
      accepted_at_ms INTEGER NOT NULL,
      updated_at_ms INTEGER NOT NULL,
      executor_started_at_ms INTEGER,
      log_artifact_id TEXT,
      completion_callback_sequence INTEGER,
      completion_token_digest TEXT CHECK (completion_token_digest IS NULL
        OR (length(completion_token_digest) = 64 AND completion_token_digest NOT GLOB '*[^0-9a-f]*')),
      executor_handle TEXT,
      recovery_reason TEXT,
      completion_acknowledged_at_ms INTEGER,
      lease_token_sealed TEXT
    ) STRICT
    """,
    "CREATE INDEX journal_by_attempt ON journal (attempt_id, lease_generation)",
    "CREATE INDEX journal_by_state ON journal (state, updated_at_ms)",
)
_SELECT_ONE: Final = f"SELECT {_COLUMNS} FROM journal WHERE offer_id = ?"
_SELECT_BY_ATTEMPT: Final = (
    f"SELECT {_COLUMNS} FROM journal WHERE attempt_id = ? "
    "ORDER BY lease_generation DESC, accepted_at_ms DESC, offer_id DESC LIMIT 1"
)
_SELECT_PAGE: Final = (
    f"SELECT {_COLUMNS} FROM journal WHERE offer_id > :after "
    "AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states))) "
    "ORDER BY offer_id LIMIT :limit"
)
_SELECT_AUDIT_PAGE: Final = "SELECT offer_id, state FROM journal WHERE offer_id > ? ORDER BY offer_id LIMIT ?"
_SELECT_ANY_AFTER: Final = "SELECT 1 FROM journal WHERE offer_id > ? LIMIT 1"
_SELECT_RECONCILE_PAGE: Final = (
    f"SELECT {_COLUMNS} FROM journal WHERE offer_id > ? "
    "AND state IN ('launching', 'started', 'running_acknowledged', 'recovery_required') "
    "ORDER BY offer_id LIMIT ?"
)
_SELECT_RECONCILE_AFTER: Final = (
    "SELECT 1 FROM journal WHERE offer_id > ? "
    "AND state IN ('launching', 'started', 'running_acknowledged', 'recovery_required') LIMIT 1"
)
_COUNT_ACTIVE: Final = (
    "SELECT count(*) FROM journal "
    "WHERE state NOT IN ('completion_acknowledged', 'start_failure_acknowledged')"
)
_INSERT: Final = f"INSERT INTO journal ({_COLUMNS}) VALUES ({', '.join('?' * 19)})"
_UPDATE: Final = (
    "UPDATE journal SET state = ?, revision = ?, updated_at_ms = ?, executor_started_at_ms = ?, "
    "log_artifact_id = ?, completion_callback_sequence = ?, completion_token_digest = ?, "
    "executor_handle = ?, recovery_reason = ?, completion_acknowledged_at_ms = ? "
    "WHERE offer_id = ? AND revision = ? AND state = ?"
)
_UPDATE_OFFER: Final = (
    "UPDATE journal SET offer_json = ?, lease_token_sealed = ?, revision = revision + 1, updated_at_ms = ? "
    "WHERE offer_id = ? AND revision = ? AND state = ?"
)
_SELECT_EXPIRED: Final = (
    "SELECT offer_id, revision, state FROM journal "
    "WHERE state IN ('completion_acknowledged', 'start_failure_acknowledged') AND updated_at_ms <= ? "
    "ORDER BY updated_at_ms, offer_id LIMIT ?"
)
_DELETE: Final = "DELETE FROM journal WHERE offer_id = ? AND revision = ? AND state = ?"
_DELETE_SETTLED: Final = (
    "DELETE FROM journal WHERE offer_id = ? "
    "AND state IN ('completion_acknowledged', 'start_failure_acknowledged', 'recovery_required')"
)


_SEAL_VERSION: Final = "s1"
_SEAL_DOMAIN: Final = b"ql3-journal-lease-token-seal-v1\0"


class TokenSeal:
    """Encrypt-then-MAC of a lease token under the worker-local key, bound to its offer id.

    The keystream is HMAC-SHA256(key, domain | "stream" | offer id | block counter), XORed with the
    token; the tag is HMAC-SHA256(key, domain | "tag" | offer id | ciphertext). An offer id always
    carries the same lease (and so the same token): a keystream is never used for two plaintexts.
    Standard library only (``hmac``, ``hashlib``).
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise JournalUnavailable(reason="key_invalid")
        self._key = key

    def __repr__(self) -> str:
        return "TokenSeal(<key>)"

    @classmethod
    def load(cls, path: Path) -> TokenSeal:
        """Read the key at ``path``, creating it (``0600``, written then linked into place) if missing."""
        try:
            return cls(_read_key(path))
        except FileNotFoundError:
            pass
        tmp = path.with_name(path.name + ".tmp")
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()  # a crash before the link below left it
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, os.urandom(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # never replaces a key that another opener linked first
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            _fsync_dir(path.parent)
            return cls(_read_key(path))
        except OSError as exc:
            raise JournalUnavailable(reason="key_unavailable") from exc

    def seal(self, offer_id: str, token: str) -> str:
        plain = token.encode()
        if not plain or len(plain) > MAX_LEASE_TOKEN_BYTES:
            raise JournalInvalid(reason="lease_token_invalid")
        cipher = bytes(a ^ b for a, b in zip(plain, self._stream(offer_id, len(plain)), strict=True))
        tag = self._tag(offer_id, cipher)
        return f"{_SEAL_VERSION}.{_b64(cipher)}.{_b64(tag)}"

    def unseal(self, offer_id: str, sealed: str) -> str:
        """The token, or ``JournalUnavailable(reason="seal_invalid")`` for a wrong key or a tampered seal."""
        try:
            version, cipher_text, tag_text = sealed.split(".")
            cipher, tag = _unb64(cipher_text), _unb64(tag_text)
        except ValueError:
            raise JournalUnavailable(reason="seal_invalid") from None
        if version != _SEAL_VERSION or not hmac.compare_digest(tag, self._tag(offer_id, cipher)):
            raise JournalUnavailable(reason="seal_invalid")
        plain = bytes(a ^ b for a, b in zip(cipher, self._stream(offer_id, len(cipher)), strict=True))
        try:
            return plain.decode()
        except UnicodeDecodeError:
            raise JournalUnavailable(reason="seal_invalid") from None

    def _stream(self, offer_id: str, length: int) -> bytes:
        prefix = _SEAL_DOMAIN + b"stream\0" + offer_id.encode() + b"\0"
        blocks = (length + 31) // 32
        stream = b"".join(
            hmac.new(self._key, prefix + i.to_bytes(4, "big"), hashlib.sha256).digest() for i in range(blocks)
        )
        return stream[:length]

    def _tag(self, offer_id: str, cipher: bytes) -> bytes:
        message = _SEAL_DOMAIN + b"tag\0" + offer_id.encode() + b"\0" + cipher
        return hmac.new(self._key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != KEY_BYTES:
            raise JournalUnavailable(reason="key_invalid")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
        return os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)


def key_path_for(journal_path: Path) -> Path:
    """Where the journal's sealing key lives: ``journal.db`` -> ``journal.key``, beside it."""
    key = journal_path.with_suffix(".key")
    return key if key != journal_path else journal_path.with_name(journal_path.name + ".key")


class WorkerJournal:
    """The single-owner local journal of one worker host.

    Every method is thread-safe (one lock, one connection) and every write is one short
    ``BEGIN IMMEDIATE`` transaction. Every write survives a crash of the process; the ``launching``
    barrier (written before every spawn) is committed with ``synchronous=FULL``, so it and every
    write before it also survive power loss. Later states are re-derivable after a power loss: the
    process died with the machine, and its handle proves that.
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
        self._clock = clock
        self._capacity = capacity
        self._mutex = threading.Lock()
        self._closed = False
        self._compromised = False

    @classmethod
    def open(cls, path: Path, *, clock: Callable[[], int], capacity: int = DEFAULT_CAPACITY) -> WorkerJournal:
        """Open (creating if missing) the journal at ``path`` and take its single-owner lock.

        Raises ``JournalInvalid`` (a ``ValueError``) for a capacity outside 1..1024, ``JournalLocked``
        when another instance in any process owns the file, ``JournalUnavailable`` when the file
        cannot be used as a journal.
        """
        _check_int(capacity, 1, MAX_CAPACITY, "capacity_out_of_range")
        path = Path(path)
        _ensure_private_dir(path.parent)
        lock_path = path.with_name(path.name + ".lock")
        lock_fd = _acquire_lock(lock_path)
        try:
            seal = TokenSeal.load(key_path_for(path))
            conn = _connect(path, seal)
        except BaseException:
            _release_lock(lock_fd)
            raise
        return cls(conn=conn, lock_fd=lock_fd, lock_path=lock_path, clock=clock, capacity=capacity, seal=seal)

    @property
    def capacity(self) -> int:
        return self._capacity

    def close(self) -> None:
        """Close the file and release the lock; idempotent. Later calls raise ``JournalClosed``."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.close()
            finally:
                _release_lock(self._lock_fd)

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
        _validate_offer(offer)
        with self._transaction(write=True) as conn:
            row = conn.execute(_SELECT_ONE, (offer.offer_id,)).fetchone()
            if row is not None:
                return AcceptResult(record=self._redelivered(conn, self._read(row), offer), created=False)
            (active,) = conn.execute(_COUNT_ACTIVE).fetchone()
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
            conn.execute(_INSERT, (*_row(record), self._sealed(record.offer_id, record.lease_token)))
            return AcceptResult(record=record, created=True)

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
    ) -> JournalRecord:
        """Move one record forward by exactly one transition, CAS on ``expected_revision``.

        ``launching`` requires the callback sequence, the sha256 hex of the completion token and the
        log artifact id; ``started`` requires the executor handle and start time; ``recovery_required``
        requires a reason; ``completion_acknowledged`` stamps its time. Other fields are refused.
        Raises ``JournalInvalid`` for bad fields, ``JournalConflict`` (``details["reason"]`` is
        ``not_found``, ``stale_revision`` or ``invalid_transition``) otherwise; nothing is written then.
        """
        if to_state not in STATES:
            raise JournalInvalid(reason="unknown_state")
        _check_int(expected_revision, 1, _MAX_INT64, "revision_invalid")
        given = {
            name
            for name, value in (
                ("completion_callback_sequence", completion_callback_sequence),
                ("completion_token_digest", completion_token_digest),
                ("log_artifact_id", log_artifact_id),
                ("executor_handle", executor_handle),
                ("executor_started_at_ms", executor_started_at_ms),
                ("recovery_reason", recovery_reason),
            )
            if value is not None
        }
        required = _REQUIRED_FIELDS.get(to_state, frozenset())
        if given - required:
            raise JournalInvalid(reason="field_not_allowed")
        if required - given:
            raise JournalInvalid(reason="field_missing")
        if completion_callback_sequence is not None:
            _check_int(completion_callback_sequence, 0, _MAX_INT64, "callback_sequence_invalid")
        if completion_token_digest is not None and not _is_digest(completion_token_digest):
            raise JournalInvalid(reason="token_digest_invalid")
        if log_artifact_id is not None and not _is_id(log_artifact_id):
            raise JournalInvalid(reason="log_artifact_id_invalid")
        if executor_handle is not None and not (
            isinstance(executor_handle, str) and _HANDLE_RE.fullmatch(executor_handle)
        ):
            raise JournalInvalid(reason="executor_handle_invalid")
        if executor_started_at_ms is not None:
            _check_int(executor_started_at_ms, 0, _MAX_INT64, "executor_started_at_invalid")
        if recovery_reason is not None and recovery_reason not in RECOVERY_REASONS:
            raise JournalInvalid(reason="recovery_reason_invalid")

        with self._transaction(write=True, durable=to_state == "launching") as conn:
            row = conn.execute(_SELECT_ONE, (offer_id,)).fetchone()
            if row is None:
                raise JournalConflict(reason="not_found")
            current = self._read(row)
            if current.revision != expected_revision:
                raise JournalConflict(reason="stale_revision")
            if to_state not in _TRANSITIONS[current.state] or not _resumable(current, to_state):
                raise JournalConflict(reason="invalid_transition")
            now = self._now(floor=current.updated_at_ms)
            updated = replace(
                current,
                state=to_state,
                revision=current.revision + 1,
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
            self._update(conn, current, updated)
            return updated

    def get(self, offer_id: str) -> JournalRecord | None:
        """The record of ``offer_id``, or None."""
        with self._transaction(write=False) as conn:
            row = conn.execute(_SELECT_ONE, (offer_id,)).fetchone()
            return None if row is None else self._read(row)

    def find_by_attempt(self, attempt_id: str) -> JournalRecord | None:
        """The record of ``attempt_id`` with the highest lease generation (latest accepted), or None."""
        with self._transaction(write=False) as conn:
            row = conn.execute(_SELECT_BY_ATTEMPT, (attempt_id,)).fetchone()
            return None if row is None else self._read(row)

    def page(
        self,
        *,
        states: Collection[str] | None = None,
        after_offer_id: str = "",
        limit: int = MAX_PAGE_LIMIT,
    ) -> list[JournalRecord]:
        """Up to ``limit`` (1..64) records after ``after_offer_id`` in offer-id order, optionally by state."""
        _check_int(limit, 1, MAX_PAGE_LIMIT, "limit_out_of_range")
        if not isinstance(after_offer_id, str) or len(after_offer_id) > 255:
            raise JournalInvalid(reason="cursor_invalid")
        states_json: str | None = None
        if states is not None:
            if isinstance(states, str) or not states or not set(states) <= STATES:
                raise JournalInvalid(reason="states_invalid")
            states_json = json.dumps(sorted(states))
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                _SELECT_PAGE, {"after": after_offer_id, "states": states_json, "limit": limit}
            ).fetchall()
            return [self._read(row) for row in rows]

    def audit(
        self, *, page_size: int = DEFAULT_AUDIT_PAGE_SIZE, max_pages: int = DEFAULT_AUDIT_MAX_PAGES
    ) -> JournalAudit:
        """Classify every record without writing. More records than ``page_size * max_pages``
        (hard 64 x 16) raises ``JournalBudgetExceeded``: no partial audit is ever returned."""
        _check_budget(page_size, max_pages)
        counts: dict[AuditClass, int] = dict.fromkeys(get_args(AuditClass), 0)
        pending: list[str] = []
        with self._transaction(write=False) as conn:
            after = ""
            for _ in range(max_pages):
                rows = conn.execute(_SELECT_AUDIT_PAGE, (after, page_size)).fetchall()
                for offer_id, state in rows:
                    audit_class = AUDIT_CLASSES.get(state)
                    if audit_class is None:
                        raise JournalUnavailable(reason="row_invalid")
                    counts[audit_class] += 1
                    if audit_class in _RECONCILE_CLASSES:
                        pending.append(offer_id)
                if len(rows) < page_size:
                    break
                after = rows[-1][0]
            else:
                if conn.execute(_SELECT_ANY_AFTER, (after,)).fetchone() is not None:
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
        _check_budget(page_size, max_pages)
        with self._transaction(write=True) as conn:
            found: list[JournalRecord] = []
            after = ""
            for _ in range(max_pages):
                rows = conn.execute(_SELECT_RECONCILE_PAGE, (after, page_size)).fetchall()
                found.extend(self._read(row) for row in rows)
                if len(rows) < page_size:
                    break
                after = found[-1].offer_id
            else:
                if conn.execute(_SELECT_RECONCILE_AFTER, (after,)).fetchone() is not None:
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
                    record = recovered
                result.append(record)
            return result

    def retention(self, *, older_than_ms: int, limit: int = DEFAULT_RETENTION_LIMIT) -> int:
        """Delete at most ``limit`` (1..64) settled records (``completion_acknowledged``,
        ``start_failure_acknowledged``) not updated for ``older_than_ms`` (1 min..30 d).

        Active records are never deleted; each delete is conditional on the revision read.
        Returns how many rows were deleted.
        """
        _check_int(older_than_ms, MIN_RETENTION_AGE_MS, MAX_RETENTION_AGE_MS, "retention_age_out_of_range")
        _check_int(limit, 1, MAX_RETENTION_LIMIT, "limit_out_of_range")
        with self._transaction(write=True) as conn:
            cutoff = self._now() - older_than_ms
            deleted = 0
            for offer_id, revision, state in conn.execute(_SELECT_EXPIRED, (cutoff, limit)).fetchall():
                deleted += conn.execute(_DELETE, (offer_id, revision, state)).rowcount
            return deleted

    def prune(self, offer_id: str) -> bool:
        """Delete one settled record now: ``completion_acknowledged``, ``start_failure_acknowledged``, or
        ``recovery_required`` once the control plane holds the outcome (the caller knows when).

        In-flight records are never deleted. Returns True when a row was deleted.
        """
        with self._transaction(write=True) as conn:
            return conn.execute(_DELETE_SETTLED, (offer_id,)).rowcount == 1

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
            or existing.state not in _REFRESHABLE_STATES
            or (existing.offer_json, existing.lease_token) == (offer.offer_json, offer.lease_token)
        ):
            return existing
        now = self._now(floor=existing.updated_at_ms)
        sealed = self._sealed(existing.offer_id, offer.lease_token)
        cursor = conn.execute(
            _UPDATE_OFFER,
            (offer.offer_json, sealed, now, existing.offer_id, existing.revision, existing.state),
        )
        if cursor.rowcount != 1:
            raise JournalConflict(reason="stale_revision")
        return replace(
            existing,
            offer_json=offer.offer_json,
            lease_token=offer.lease_token,
            revision=existing.revision + 1,
            updated_at_ms=now,
        )

    def _sealed(self, offer_id: str, token: str | None) -> str | None:
        return None if token is None else self._seal.seal(offer_id, token)

    def _read(self, row: tuple[Any, ...]) -> JournalRecord:
        record = _record(row)
        sealed = row[18]
        if sealed is None:
            return record
        if not isinstance(sealed, str):
            raise JournalUnavailable(reason="row_invalid")
        return replace(record, lease_token=self._seal.unseal(record.offer_id, sealed))

    def _update(self, conn: sqlite3.Connection, current: JournalRecord, updated: JournalRecord) -> None:
        cursor = conn.execute(
            _UPDATE,
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
            raise JournalConflict(reason="stale_revision")

    def _now(self, *, floor: int = 0) -> int:
        now = self._clock()
        if isinstance(now, bool) or not isinstance(now, int) or now < 0:
            raise JournalInvalid(reason="clock_invalid")
        # A clock stepping backwards must not make a record look older than its last write.
        return max(now, floor)

    @contextmanager
    def _transaction(self, *, write: bool, durable: bool = False) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            conn = self._owned_connection()
            try:
                if durable:
                    # The crash barrier itself: fsync the WAL (and every earlier frame) at this commit.
                    conn.execute("PRAGMA synchronous = FULL")
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield conn
                conn.execute("COMMIT")
                if durable:
                    conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise JournalUnavailable() from exc
            except BaseException:
                _rollback(conn)
                raise

    def _owned_connection(self) -> sqlite3.Connection:
        if self._closed:
            raise JournalClosed()
        if self._compromised:
            raise JournalCompromised()
        # flock protects an inode, not a name: if the lock file was removed or replaced, a second
        # owner may already hold the new one, so this instance stops for good.
        try:
            owned = os.path.samestat(os.stat(self._lock_path), os.fstat(self._lock_fd))
        except OSError:
            owned = False
        if not owned:
            self._compromised = True
            raise JournalCompromised()
        return self._conn


def _resumable(current: JournalRecord, to_state: str) -> bool:
    """``recovery_required -> started`` only resolves an unknown launch outcome that has no handle yet."""
    if current.state != "recovery_required" or to_state != "started":
        return True
    return current.recovery_reason == "launch_outcome_unknown" and current.executor_handle is None


def _validate_offer(offer: JournalOffer) -> None:
    if not all(_is_id(value) for value in (offer.offer_id, offer.run_id, offer.attempt_id)):
        raise JournalInvalid(reason="id_invalid")
    _check_int(offer.lease_generation, 0, _MAX_INT64, "lease_generation_invalid")
    if not _is_digest(offer.execution_spec_digest):
        raise JournalInvalid(reason="spec_digest_invalid")
    if offer.delivery_kind not in DELIVERY_KINDS:
        raise JournalInvalid(reason="delivery_kind_invalid")
    if offer.lease_token is not None and (
        not isinstance(offer.lease_token, str)
        or not 0 < len(offer.lease_token.encode()) <= MAX_LEASE_TOKEN_BYTES
    ):
        raise JournalInvalid(reason="lease_token_invalid")
    if not isinstance(offer.offer_json, str) or len(offer.offer_json.encode()) > MAX_OFFER_JSON_BYTES:
        raise JournalInvalid(reason="offer_invalid")
    try:
        parsed = json.loads(offer.offer_json)
    except ValueError:
        raise JournalInvalid(reason="offer_invalid") from None
    if not isinstance(parsed, dict):
        raise JournalInvalid(reason="offer_invalid")


def _is_id(value: object) -> bool:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


def _check_int(value: object, low: int, high: int, reason: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise JournalInvalid(reason=reason)


def _check_budget(page_size: int, max_pages: int) -> None:
    _check_int(page_size, 1, MAX_PAGE_LIMIT, "page_size_out_of_range")
    _check_int(max_pages, 1, MAX_AUDIT_PAGES, "max_pages_out_of_range")


def _keep(new: _T | None, old: _T | None) -> _T | None:
    return old if new is None else new


def _row(record: JournalRecord) -> tuple[Any, ...]:
    return (
        record.offer_id,
        record.run_id,
        record.attempt_id,
        record.lease_generation,
        record.execution_spec_digest,
        record.delivery_kind,
        record.state,
        record.revision,
        record.offer_json,
        record.accepted_at_ms,
        record.updated_at_ms,
        record.executor_started_at_ms,
        record.log_artifact_id,
        record.completion_callback_sequence,
        record.completion_token_digest,
        record.executor_handle,
        record.recovery_reason,
        record.completion_acknowledged_at_ms,
    )


def _record(row: tuple[Any, ...]) -> JournalRecord:
    state, delivery_kind, reason = row[6], row[5], row[16]
    if (
        state not in STATES
        or delivery_kind not in DELIVERY_KINDS
        or (reason is not None and reason not in RECOVERY_REASONS)
    ):
        raise JournalUnavailable(reason="row_invalid")
    return JournalRecord(
        offer_id=row[0],
        run_id=row[1],
        attempt_id=row[2],
        lease_generation=row[3],
        execution_spec_digest=row[4],
        delivery_kind=delivery_kind,
        state=state,
        revision=row[7],
        offer_json=row[8],
        accepted_at_ms=row[9],
        updated_at_ms=row[10],
        executor_started_at_ms=row[11],
        log_artifact_id=row[12],
        completion_callback_sequence=row[13],
        completion_token_digest=row[14],
        executor_handle=row[15],
        recovery_reason=reason,
        completion_acknowledged_at_ms=row[17],
    )


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _ensure_private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return
    # mkdir's mode is filtered by the umask; the directory we created must be exactly 0700.
    os.chmod(directory, 0o700)


def _acquire_lock(lock_path: Path) -> int:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JournalUnavailable() from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.fchmod(fd, 0o600)
    except BlockingIOError:
        os.close(fd)
        raise JournalLocked() from None
    except OSError as exc:
        os.close(fd)
        raise JournalUnavailable() from exc
    # The previous owner may have unlinked the name between our open and our flock.
    try:
        same = os.path.samestat(os.stat(lock_path), os.fstat(fd))
    except OSError:
        same = False
    if not same:
        _release_lock(fd)
        raise JournalLocked()
    return fd


def _release_lock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _connect(path: Path, seal: TokenSeal) -> sqlite3.Connection:
    try:
        created = _create_private_file(path)
        if created:
            _fsync_dir(path.parent)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    except (OSError, sqlite3.Error) as exc:
        raise JournalUnavailable() from exc
    try:
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            raise JournalUnavailable(reason="wal_unavailable")
        # NORMAL survives a crash of the process; the launching barrier upgrades its own commit to FULL
        # so it also survives power loss (see _transaction).
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA trusted_schema = OFF")
        # Deleted and rewritten content is zeroed, not left in free pages of the file.
        conn.execute("PRAGMA secure_delete = ON")
        _migrate(conn, seal)
        for suffix in ("-wal", "-shm"):
            sidecar = path.with_name(path.name + suffix)
            if sidecar.exists():
                os.chmod(sidecar, 0o600)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, (OSError, sqlite3.Error)):
            raise JournalUnavailable() from exc
        raise
    return conn


def _seal_version_1_tokens(conn: sqlite3.Connection, seal: TokenSeal) -> None:
    """Schema 1 kept the raw lease token in ``offer_json`` (``fence.leaseToken``): move each one into
    ``lease_token_sealed``. The journal holds at most ``MAX_CAPACITY`` active rows, so this is bounded."""
    conn.execute("ALTER TABLE journal ADD COLUMN lease_token_sealed TEXT")
    rows = conn.execute("SELECT offer_id, offer_json FROM journal LIMIT ?", (4 * MAX_CAPACITY,)).fetchall()
    for offer_id, offer_json in rows:
        try:
            parsed = json.loads(offer_json)
            token = parsed["fence"]["leaseToken"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(token, str) or not token:
            continue
        parsed["fence"]["leaseToken"] = ""
        conn.execute(
            "UPDATE journal SET offer_json = ?, lease_token_sealed = ? WHERE offer_id = ?",
            (
                json.dumps(parsed, separators=(",", ":"), ensure_ascii=False),
                seal.seal(offer_id, token),
                offer_id,
            ),
        )


def _create_private_file(path: Path) -> bool:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
        created = False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JournalUnavailable(reason="not_a_file")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return created


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _migrate(conn: sqlite3.Connection, seal: TokenSeal) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version == 0:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version == 1:
            _seal_version_1_tokens(conn, seal)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise JournalUnavailable(reason="schema_unsupported")
        conn.execute("COMMIT")
        if version == 1:
            # The raw tokens may still sit in WAL frames: fold them into the (zeroed) pages now.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except BaseException:
        _rollback(conn)
        raise
