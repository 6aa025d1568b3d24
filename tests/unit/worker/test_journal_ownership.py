"""One owner per journal file, private file modes, crash-barrier settings, lifecycle and thread safety."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ql3
from ql3.domain.journal import (
    JournalClosed,
    JournalCompromised,
    JournalConflict,
    JournalLocked,
    JournalOffer,
    JournalUnavailable,
)
from ql3.worker.journal.store import WorkerJournal

START_MS = 1_800_000_000_000
SRC = Path(ql3.__file__).resolve().parents[1]


def _clock() -> int:
    return START_MS


def _offer(offer_id: str = "offer-1") -> JournalOffer:
    return JournalOffer(
        offer_id=offer_id,
        run_id="run-1",
        attempt_id="attempt-" + offer_id,
        lease_generation=1,
        execution_spec_digest=hashlib.sha256(b"spec").hexdigest(),
        delivery_kind="new_claim",
        offer_json=json.dumps({"lease": {"token": "secret"}}),
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal" / "worker.db"


@pytest.fixture
def journal(path: Path) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(path, clock=_clock) as opened:
        yield opened


def test_a_second_instance_in_this_process_is_refused_until_the_first_closes(path: Path) -> None:
    # Given an open journal
    first = WorkerJournal.open(path, clock=_clock)
    first.accept(_offer())

    # When a second instance opens the same file
    with pytest.raises(JournalLocked) as caught:
        WorkerJournal.open(path, clock=_clock)
    assert caught.value.code == "journal_locked"

    # Then only after the first closes can another take over, with the data intact
    first.close()
    with WorkerJournal.open(path, clock=_clock) as second:
        assert second.get("offer-1") is not None


def test_a_second_owner_in_another_process_is_refused(journal: WorkerJournal, path: Path) -> None:
    # Given this process owns the journal
    script = """
        import sys
        from pathlib import Path
        from ql3.domain.journal import JournalLocked
        from ql3.worker.journal.store import WorkerJournal

        try:
            WorkerJournal.open(Path(sys.argv[1]), clock=lambda: 0)
        except JournalLocked as exc:
            print(exc.code)
            sys.exit(3)
        sys.exit(0)
    """

    # When another process tries to open it
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )

    # Then it is refused, and this owner keeps working
    assert (child.returncode, child.stdout.strip()) == (3, "journal_locked"), child.stderr
    assert journal.accept(_offer()).created is True


def test_the_file_is_private(journal: WorkerJournal, path: Path) -> None:
    journal.accept(_offer())

    assert _mode(path.parent) == 0o700
    assert _mode(path) == 0o600
    assert _mode(path.with_name("worker.db.lock")) == 0o600
    for suffix in ("-wal", "-shm"):
        sidecar = path.with_name("worker.db" + suffix)
        assert sidecar.exists()
        assert _mode(sidecar) == 0o600


def test_modes_are_exact_whatever_the_umask(path: Path) -> None:
    # Given a umask that would leave the owner without write access
    previous = os.umask(0o277)
    try:
        # When the journal creates its directory and files
        journal = WorkerJournal.open(path, clock=_clock)
    finally:
        os.umask(previous)

    # Then the modes are exactly the private ones, and the journal is writable
    try:
        assert _mode(path.parent) == 0o700
        assert _mode(path) == 0o600
        assert _mode(path.with_name("worker.db.lock")) == 0o600
        assert journal.accept(_offer()).created is True
    finally:
        journal.close()


def test_an_existing_wider_file_is_tightened_to_0600(path: Path) -> None:
    # Given a journal file that someone made group- and world-readable
    with WorkerJournal.open(path, clock=_clock) as journal:
        journal.accept(_offer())
    os.chmod(path, 0o644)

    # When it is opened again
    with WorkerJournal.open(path, clock=_clock) as journal:
        # Then it is private again and still holds its data
        assert _mode(path) == 0o600
        assert journal.get("offer-1") is not None


def test_the_file_is_a_wal_database_and_only_the_launching_barrier_is_fsynced(
    journal: WorkerJournal, path: Path
) -> None:
    # Given a trace of every statement the journal sends to SQLite
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)

    # When an offer is accepted, acknowledged, crosses the launching barrier, and is started
    record = journal.accept(_offer()).record
    record = journal.advance(
        record.offer_id, expected_revision=record.revision, to_state="starting_acknowledged"
    )
    before_barrier = len(statements)
    record = journal.advance(
        record.offer_id,
        expected_revision=record.revision,
        to_state="launching",
        completion_callback_sequence=1,
        completion_token_digest="a" * 64,
        log_artifact_id="artifact-1",
    )
    after_barrier = len(statements)
    journal.advance(
        record.offer_id,
        expected_revision=record.revision,
        to_state="started",
        executor_handle="ql3lp1.eyJ2IjoxfQ",
        executor_started_at_ms=1,
    )

    # Then only the barrier's commit ran under synchronous=FULL (the next write sets NORMAL back
    # before its own transaction), and the file is a WAL database
    assert not any("synchronous = FULL" in s for s in statements[:before_barrier])
    barrier = statements[before_barrier:after_barrier]
    assert barrier[0] == "PRAGMA synchronous = FULL" and barrier[-1] == "COMMIT"
    assert statements[after_barrier] == "PRAGMA synchronous = NORMAL"
    assert statements[after_barrier + 1] == "BEGIN IMMEDIATE"
    assert journal._conn.execute("PRAGMA synchronous").fetchone() == (1,)
    probe = sqlite3.connect(path)
    try:
        assert probe.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert probe.execute("PRAGMA user_version").fetchone() == (2,)
    finally:
        probe.close()


def test_a_replaced_lock_file_makes_the_old_owner_dead_for_good(journal: WorkerJournal, path: Path) -> None:
    # Given an open journal whose lock file is removed behind its back
    journal.accept(_offer())
    lock = path.with_name("worker.db.lock")
    lock.unlink()

    # When the old owner is used again
    with pytest.raises(JournalCompromised) as caught:
        journal.get("offer-1")

    # Then it refuses every operation, even after the lock name is back, while a new owner can take over
    assert caught.value.code == "journal_compromised"
    with WorkerJournal.open(path, clock=_clock) as new_owner:
        assert new_owner.get("offer-1") is not None
        with pytest.raises(JournalCompromised):
            journal.accept(_offer("offer-2"))
        with pytest.raises(JournalCompromised):
            journal.audit()


def test_a_lock_file_replaced_by_another_inode_makes_the_old_owner_dead(
    journal: WorkerJournal, path: Path
) -> None:
    # Given an open journal whose lock name now points at another file (the name exists, the inode
    # is not the one the owner holds its flock on)
    journal.accept(_offer())
    lock = path.with_name("worker.db.lock")
    other = path.with_name("other.lock")
    other.write_bytes(b"")
    other.replace(lock)

    # When the old owner is used again, then it refuses, for reads from memory as for writes
    with pytest.raises(JournalCompromised):
        journal.get("offer-1")
    with pytest.raises(JournalCompromised):
        journal.accept(_offer("offer-2"))


def test_a_closed_journal_refuses_every_operation(path: Path) -> None:
    journal = WorkerJournal.open(path, clock=_clock)
    journal.close()
    journal.close()

    with pytest.raises(JournalClosed):
        journal.accept(_offer())
    with pytest.raises(JournalClosed):
        journal.get("offer-1")
    with pytest.raises(JournalClosed):
        journal.page()


def test_a_file_that_is_not_a_journal_is_refused_and_the_lock_released(path: Path) -> None:
    # Given a file at the journal path that is not a SQLite database
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all" * 100)

    # When it is opened as a journal
    with pytest.raises(JournalUnavailable):
        WorkerJournal.open(path, clock=_clock)

    # Then the failure does not leave the lock held
    path.unlink()
    WorkerJournal.open(path, clock=_clock).close()


def test_a_journal_from_a_newer_schema_is_refused(path: Path) -> None:
    WorkerJournal.open(path, clock=_clock).close()
    probe = sqlite3.connect(path)
    probe.execute("PRAGMA user_version = 3")
    probe.close()

    with pytest.raises(JournalUnavailable) as caught:
        WorkerJournal.open(path, clock=_clock)

    assert caught.value.details["reason"] == "schema_unsupported"


def test_concurrent_writers_are_serialised(journal: WorkerJournal) -> None:
    # Given one record, and eight threads that each accept their own offer and all race on that record
    journal.accept(_offer("offer-shared"))
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            journal.accept(_offer(f"offer-{index}"))
            try:
                journal.advance("offer-shared", expected_revision=1, to_state="starting_acknowledged")
                outcomes.append("won")
            except JournalConflict:
                outcomes.append("lost")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]

    # When they run at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    # Then every accept landed and exactly one CAS won
    assert errors == []
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    assert len(journal.page()) == 9
    shared = journal.get("offer-shared")
    assert shared is not None and shared.revision == 2


@pytest.mark.parametrize("bad_clock", [lambda: -1, lambda: 1.5, lambda: True])
def test_a_broken_clock_writes_nothing(path: Path, bad_clock: Any) -> None:
    with WorkerJournal.open(path, clock=bad_clock) as journal:
        with pytest.raises(ValueError):
            journal.accept(_offer())
        assert journal.page() == []
