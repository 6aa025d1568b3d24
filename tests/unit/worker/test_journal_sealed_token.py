"""The lease token in the journal is sealed (issue 9 item 13): the file never holds it raw, the journal
unseals it for recovery with the worker-local key, a wrong key or a tampered seal is refused, and a
schema-1 journal (raw token in ``offer_json``) is converted on open."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.domain.journal import JournalInvalid, JournalUnavailable
from ql3.worker.journal.seal import TokenSeal, key_path_for
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import Clock, make_offer, walk

TOKEN = "9f" * 32  # the shape of a derived lease token (64 hex)
FENCE_JSON = json.dumps({"fence": {"runId": "run-1", "leaseToken": ""}, "spec": {}})


def _files(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")) if p.is_file())


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "worker" / "journal.db"


@pytest.fixture
def journal(path: Path) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(path, clock=Clock()) as opened:
        yield opened


def test_the_token_is_unsealed_for_recovery_but_never_written_raw(journal: WorkerJournal, path: Path) -> None:
    # When an offer with its lease token goes through every state up to running_acknowledged
    journal.accept(make_offer(offer_json=FENCE_JSON, lease_token=TOKEN))
    walk(journal, "offer-1", "starting_acknowledged", "launching", "started", "running_acknowledged")

    # Then every read gives the token back (a restarted worker presents it) ...
    record = journal.get("offer-1")
    assert record is not None and record.lease_token == TOKEN
    assert [r.lease_token for r in journal.startup_recovery()] == [TOKEN]
    assert TOKEN not in repr(record)
    # ... while neither the database nor its WAL holds it, in any encoding
    on_disk = _files(path)
    assert on_disk
    for form in (TOKEN.encode(), bytes.fromhex(TOKEN), TOKEN.upper().encode()):
        assert form not in on_disk
    (sealed,) = sqlite3.connect(path).execute("SELECT lease_token_sealed FROM journal").fetchone()
    assert sealed.startswith("s1.") and TOKEN not in sealed


def test_the_key_is_private_and_stable_across_reopens(path: Path) -> None:
    with WorkerJournal.open(path, clock=Clock()) as first:
        first.accept(make_offer(offer_json=FENCE_JSON, lease_token=TOKEN))
    key = key_path_for(path)
    assert key.name == "journal.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    assert key.read_bytes() not in _files(path)

    with WorkerJournal.open(path, clock=Clock()) as second:
        record = second.get("offer-1")
        assert record is not None and record.lease_token == TOKEN


def test_another_key_cannot_unseal_the_journal(path: Path) -> None:
    with WorkerJournal.open(path, clock=Clock()) as first:
        first.accept(make_offer(offer_json=FENCE_JSON, lease_token=TOKEN))
    # A copy of the journal without its key is worth nothing: a fresh key cannot open the seal
    key_path_for(path).unlink()

    with WorkerJournal.open(path, clock=Clock()) as second, pytest.raises(JournalUnavailable) as caught:
        second.get("offer-1")

    assert caught.value.details["reason"] == "seal_invalid"


def test_a_seal_is_bound_to_its_offer_and_its_bytes() -> None:
    seal = TokenSeal(os.urandom(32))
    sealed = seal.seal("offer-1", TOKEN)
    assert seal.unseal("offer-1", sealed) == TOKEN

    version, cipher, tag = sealed.split(".")
    flipped = ("A" if cipher[0] != "A" else "B") + cipher[1:]
    for bad in ("offer-2", "offer-1"):
        candidate = sealed if bad == "offer-2" else f"{version}.{flipped}.{tag}"
        with pytest.raises(JournalUnavailable):
            seal.unseal(bad, candidate)
    for malformed in ("", "s1.x", f"s2.{cipher}.{tag}", "s1.!!.??"):
        with pytest.raises(JournalUnavailable):
            seal.unseal("offer-1", malformed)
    with pytest.raises(JournalInvalid):
        seal.seal("offer-1", "")


def test_an_invalid_key_file_is_refused(path: Path) -> None:
    path.parent.mkdir(mode=0o700)
    key_path_for(path).write_bytes(b"short")

    with pytest.raises(JournalUnavailable) as caught:
        WorkerJournal.open(path, clock=Clock())

    assert caught.value.details["reason"] == "key_invalid"


def test_a_schema_1_journal_has_its_raw_tokens_sealed_on_open(path: Path) -> None:
    # Given a journal written by schema 1: the raw lease token inside offer_json
    with WorkerJournal.open(path, clock=Clock()) as current:
        current.accept(make_offer(offer_json=FENCE_JSON))
    raw = json.dumps({"fence": {"runId": "run-1", "leaseToken": TOKEN}, "spec": {}})
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE journal DROP COLUMN lease_token_sealed")
    conn.execute("UPDATE journal SET offer_json = ?", (raw,))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    assert TOKEN.encode() in _files(path)

    # When it is opened by this version
    with WorkerJournal.open(path, clock=Clock()) as upgraded:
        record = upgraded.get("offer-1")

    # Then the token moved into the seal, and no byte of the files holds it raw any more
    assert record is not None and record.lease_token == TOKEN
    assert json.loads(record.offer_json)["fence"]["leaseToken"] == ""
    assert TOKEN.encode() not in _files(path)
