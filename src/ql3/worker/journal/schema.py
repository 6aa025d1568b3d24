"""The journal's SQLite file: its schema (``PRAGMA user_version``), the statements the store runs,
the mapping between a row and a record, and opening and migrating the file."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Final

from ql3.domain.journal import DELIVERY_KINDS, RECOVERY_REASONS, STATES, JournalRecord, JournalUnavailable
from ql3.worker.journal.files import create_private_file, fsync_dir
from ql3.worker.journal.seal import TokenSeal
from ql3.worker.journal.validation import MAX_CAPACITY

SCHEMA_VERSION: Final = 2

COLUMNS: Final = (
    "offer_id, run_id, attempt_id, lease_generation, execution_spec_digest, delivery_kind, state, "
    "revision, offer_json, accepted_at_ms, updated_at_ms, executor_started_at_ms, log_artifact_id, "
    "completion_callback_sequence, completion_token_digest, executor_handle, recovery_reason, "
    "completion_acknowledged_at_ms, lease_token_sealed"
)
SCHEMA: Final = (
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
SELECT_ONE: Final = f"SELECT {COLUMNS} FROM journal WHERE offer_id = ?"
SELECT_BY_ATTEMPT: Final = (
    f"SELECT {COLUMNS} FROM journal WHERE attempt_id = ? "
    "ORDER BY lease_generation DESC, accepted_at_ms DESC, offer_id DESC LIMIT 1"
)
SELECT_PAGE: Final = (
    f"SELECT {COLUMNS} FROM journal WHERE offer_id > :after "
    "AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states))) "
    "ORDER BY offer_id LIMIT :limit"
)
SELECT_KEYS: Final = "SELECT offer_id, attempt_id, lease_generation, accepted_at_ms FROM journal LIMIT ?"
SELECT_AUDIT_PAGE: Final = "SELECT offer_id, state FROM journal WHERE offer_id > ? ORDER BY offer_id LIMIT ?"
SELECT_ANY_AFTER: Final = "SELECT 1 FROM journal WHERE offer_id > ? LIMIT 1"
SELECT_RECONCILE_PAGE: Final = (
    f"SELECT {COLUMNS} FROM journal WHERE offer_id > ? "
    "AND state IN ('launching', 'started', 'running_acknowledged', 'recovery_required') "
    "ORDER BY offer_id LIMIT ?"
)
SELECT_RECONCILE_AFTER: Final = (
    "SELECT 1 FROM journal WHERE offer_id > ? "
    "AND state IN ('launching', 'started', 'running_acknowledged', 'recovery_required') LIMIT 1"
)
COUNT_ACTIVE: Final = (
    "SELECT count(*) FROM journal "
    "WHERE state NOT IN ('completion_acknowledged', 'start_failure_acknowledged')"
)
INSERT: Final = f"INSERT INTO journal ({COLUMNS}) VALUES ({', '.join('?' * 19)})"
UPDATE: Final = (
    "UPDATE journal SET state = ?, revision = ?, updated_at_ms = ?, executor_started_at_ms = ?, "
    "log_artifact_id = ?, completion_callback_sequence = ?, completion_token_digest = ?, "
    "executor_handle = ?, recovery_reason = ?, completion_acknowledged_at_ms = ? "
    "WHERE offer_id = ? AND revision = ? AND state = ?"
)
UPDATE_OFFER: Final = (
    "UPDATE journal SET offer_json = ?, lease_token_sealed = ?, revision = revision + 1, updated_at_ms = ? "
    "WHERE offer_id = ? AND revision = ? AND state = ?"
)
SELECT_EXPIRED: Final = (
    "SELECT offer_id, revision, state FROM journal "
    "WHERE state IN ('completion_acknowledged', 'start_failure_acknowledged') AND updated_at_ms <= ? "
    "ORDER BY updated_at_ms, offer_id LIMIT ?"
)
DELETE: Final = "DELETE FROM journal WHERE offer_id = ? AND revision = ? AND state = ?"
DELETE_SETTLED: Final = (
    "DELETE FROM journal WHERE offer_id = ? "
    "AND state IN ('completion_acknowledged', 'start_failure_acknowledged', 'recovery_required')"
)


def row_of(record: JournalRecord) -> tuple[Any, ...]:
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


def record_of(row: tuple[Any, ...]) -> JournalRecord:
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


def rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def connect(path: Path, seal: TokenSeal) -> sqlite3.Connection:
    try:
        created = create_private_file(path)
        if created:
            fsync_dir(path.parent)
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


def _migrate(conn: sqlite3.Connection, seal: TokenSeal) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version == 0:
            for statement in SCHEMA:
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
        rollback(conn)
        raise
