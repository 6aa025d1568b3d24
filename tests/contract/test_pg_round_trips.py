"""The PostgreSQL adapter's short units (docs/dispatch.md, "dispatch on PostgreSQL"): a pooled
connection whose backend was terminated does not fail the next unit, a connection lost after the
unit's first exchange is StorageUnavailable and the unit is never re-run, the claim still takes the
Run and Attempt row locks, and one offer costs a bounded number of round trips."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ql3.application import lease_claims, lease_expiry, lease_results, leases
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import Conflict, StorageUnavailable
from ql3.domain.ids import new_id
from ql3.domain.offers import derive_lease_token
from ql3.storage.postgres.adapter import PostgresDatabase
from tests.support.builders import count
from tests.support.cluster import TcpProxy
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, register
from tests.support.round_trips import count_round_trips

# BEGIN + clock + candidate page; the first worker page with the COMMIT; the second worker page in a
# read transaction of its own (BEGIN, clock, page, COMMIT: the snapshot is a placement hint); BEGIN +
# clock + the claim (one ql3_claim_or_raise call: Run, Attempt, worker and lease locks, lease with the
# counter, Run CAS, Attempt CAS, event) + COMMIT in one pipeline (was 33, then 12 with the claim as
# eight exchanges, then 6 with the read unit's and the claim's COMMIT apart).
ROUND_TRIPS_PER_OFFER = 4
# A cycle of several offers (max_offers_per_cycle): the same read unit, and one ql3_claim_batch call
# for all its claims in one write unit with its own COMMIT, so 8 offers cost what one did and one more
# (0.62 round trips per offer; was 6).
OFFERS_PER_BATCH = 8
ROUND_TRIPS_PER_BATCH = 5


@pytest.fixture
def pg(pg_harness: Harness) -> Harness:
    return pg_harness


def _waiter_on(watch: psycopg.Connection[Any], holder_pid: int, function: str, never: str) -> int:
    """The backend that waits on a row lock ``holder_pid`` holds, running ``function``; fails with
    ``never`` when none does within about five seconds."""
    for _ in range(1000):
        row = watch.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(pid))",
            (holder_pid,),
        ).fetchone()
        if row is not None:
            assert function in str(row[1]), row[1]
            return int(row[0])
        time.sleep(0.005)
    raise AssertionError(never)


def _tuple_locks_of(watch: psycopg.Connection[Any], pid: int) -> list[str]:
    """The tables of the row (tuple) locks backend ``pid`` waits for or holds."""
    rows = watch.execute(
        "SELECT relation::regclass::text FROM pg_locks WHERE pid = %s AND locktype = 'tuple'", (pid,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def _terminate(harness: Harness, pids: list[int]) -> None:
    """pg_terminate_backend, then wait (bounded) until the backends are gone."""
    with psycopg.connect(harness.db.dsn, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(500):
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.01)
    pytest.fail(f"backends {pids} did not go away")


def _insert_project(tx: Any, name: str) -> int:
    return int(tx.run("project_insert", {"id": new_id(), "name": name, "now": tx.now_ms()}))


def test_a_pooled_connection_whose_backend_was_terminated_does_not_fail_the_next_unit(pg: Harness) -> None:
    # Given a pool of two idle connections whose backends are then terminated
    db = PostgresDatabase(pg.db.dsn, min_size=2, max_size=2)
    try:
        with db.pool.connection() as a, db.pool.connection() as b:
            pids = [a.info.backend_pid, b.info.backend_pid]
        _terminate(pg, pids)
        before = count(pg.db, "projects")
        calls: list[int] = []

        def unit(tx: Any) -> int:
            calls.append(1)
            return _insert_project(tx, f"after-{len(calls)}")

        # When the next unit of work runs
        assert db.transaction(unit) == 1

        # Then both were discarded at checkout, before the unit ran: it ran once, on a fresh one
        assert count(pg.db, "projects") == before + 1
        assert calls == [1]
    finally:
        db.close()


def test_a_connection_lost_after_the_first_exchange_is_unavailable_and_not_re_run(pg: Harness) -> None:
    db = PostgresDatabase(pg.db.dsn, min_size=1, max_size=2)
    try:
        before = count(pg.db, "projects")
        calls: list[int] = []

        def unit(tx: Any) -> None:
            calls.append(1)
            _insert_project(tx, "lost")
            _terminate(pg, [tx._conn.info.backend_pid])
            _insert_project(tx, "never")

        # When the unit's backend dies after its first statement was answered
        with pytest.raises(StorageUnavailable):
            db.transaction(unit)

        # Then the unit was not run again and nothing of it was committed
        assert calls == [1]
        assert count(pg.db, "projects") == before
    finally:
        db.close()


class _HangsUpLate(TcpProxy):
    """Forwards a PostgreSQL connection, but when the server hangs up it keeps the client's side
    open until the client sends a COMMIT: the goodbye (the terminated backend's FATAL) has reached
    the client, the end of the stream arrives only after the unit queued its COMMIT. That is what a
    backend slow to exit looks like under load."""

    def __init__(self, upstream_port: int) -> None:
        self.hung_up = threading.Event()  # set once a server's goodbye was forwarded
        self._gone: set[socket.socket] = set()  # the client sides of those connections
        super().__init__(upstream_port)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        # As PostgreSQL and libpq do: without it the goodbye could wait for the client's delayed ACK
        dst.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if src.getpeername()[1] != self.upstream_port:
            self._from_client(src, dst)
            return
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            src.shutdown(socket.SHUT_RDWR)  # the server's side only: its descriptor stays ours
        self._gone.add(dst)
        self.hung_up.set()

    def _from_client(self, client: socket.socket, server: socket.socket) -> None:
        late = b""
        try:
            while data := client.recv(65536):
                if client in self._gone:
                    late += data
                    if b"COMMIT" in late:
                        break
                else:
                    server.sendall(data)
        except OSError:
            pass
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.mark.parametrize("route", ["direct", "goodbye_before_end_of_stream"])
def test_a_unit_that_commits_with_its_statement_survives_a_terminated_pooled_connection(
    pg: Harness, route: str
) -> None:
    # Given a claimed run, and a pool of one idle connection whose backend is then terminated; either
    # straight to the server, or through a proxy that passes on the backend's FATAL at once but the
    # end of its stream only after the client queued a COMMIT (a backend slow to exit, under load)
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    queued(pg.db)
    offer = dispatcher(pg.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None
    proxy = None
    dsn = pg.db.dsn
    if route == "goodbye_before_end_of_stream":
        proxy = _HangsUpLate(int(conninfo_to_dict(dsn).get("port") or 5432))
        dsn = make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    db = PostgresDatabase(dsn, min_size=1, max_size=1)
    try:
        with db.pool.connection() as conn:
            pid = conn.info.backend_pid
        _terminate(pg, [pid])
        assert proxy is None or proxy.hung_up.wait(10)

        # When the starting ACK runs (BEGIN, its one statement and COMMIT in one pipeline)
        answer, _ = db.transaction(lambda tx: lease_results.ack_starting(tx, offer.fence))

        # Then the dead connection was discarded at checkout and the ACK ran on a fresh one, applied
        # once (on the dead one its COMMIT would have been queued before the hang-up was seen:
        # StorageUnavailable, the ACK's fate unknown)
        assert answer == "starting"
        assert pg.db.raw("SELECT status FROM run_attempts") == [{"status": "starting"}]
    finally:
        db.close()
        if proxy is not None:
            proxy.cut()


def _claim(harness: Harness, run_id: str, attempt_id: str) -> Any:
    w = harness.db.raw("SELECT * FROM workers")[0]
    return harness.db.transaction(
        lambda tx: lease_claims.claim(
            tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id=w["worker_id"],
            session_id=w["session_id"],
            worker_generation=int(w["generation"]),
            token_for_generation=lambda g: derive_lease_token(SECRET, attempt_id, g),
            lease_ms=600_000,
        )
    )


def _expired_unstarted(pg: Harness, claims: list[tuple[str, str]]) -> None:
    """Each (run, attempt) claimed once, its lease expired unstarted and released (the run queued
    again with a lease row to reacquire); the worker stays online."""
    for run_id, attempt_id in claims:
        assert _claim(pg, run_id, attempt_id).status == "claimed"
    pg.advance_clock(600_000)
    for _, attempt_id in claims:
        assert pg.db.transaction(lambda tx, a=attempt_id: lease_expiry.expire_lease(tx, a)) == "released"
    pg.db.raw("UPDATE workers SET lease_expires_at_ms = lease_expires_at_ms + 600000")


def test_a_claim_sent_with_its_commit_keeps_nothing_of_a_claim_whose_run_cas_missed(pg: Harness) -> None:
    # Given a queued run whose Run row update is silently skipped (a trigger), so that ql3_claim's
    # Run CAS matches nothing after it wrote the lease and the worker's counter
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    _, _, (run,) = queued(pg.db)
    attempt_id = str(pg.db.raw("SELECT id FROM run_attempts")[0]["id"])
    pg.db.raw(
        "CREATE FUNCTION test_skip_update() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
    )
    pg.db.raw(
        "CREATE TRIGGER test_skip BEFORE UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION test_skip_update()"
    )
    w = pg.db.raw("SELECT * FROM workers")[0]

    # When the claim runs as its unit's last statement (with the COMMIT in the same round trip)
    with pytest.raises(Conflict):
        pg.db.transaction(
            lambda tx: lease_claims.claim(
                tx,
                run_id=run.id,
                attempt_id=attempt_id,
                worker_id="w1",
                session_id=w["session_id"],
                worker_generation=int(w["generation"]),
                token_for_generation=lambda g: derive_lease_token(SECRET, attempt_id, g),
                lease_ms=600_000,
                last=True,
            )
        )

    # Then the conflict rolled the whole claim back: no lease, no slot taken, no event
    assert count(pg.db, "run_leases") == 0
    assert pg.db.raw("SELECT active_leases FROM workers") == [{"active_leases": 0}]
    assert pg.db.raw("SELECT status FROM runs") == [{"status": "queued"}]


# The claim's row locks in their order (docs/dispatch.md); on PostgreSQL all four are taken inside
# the one ql3_claim statement, so the order is observed from outside: which row the claim waits on,
# and which rows it holds by then.
LOCK_ORDER = [("runs", "id"), ("run_attempts", "id"), ("workers", "worker_id"), ("run_leases", "attempt_id")]


def _locked_elsewhere(watch: psycopg.Connection[Any], table: str, column: str, key: str) -> bool:
    try:
        watch.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE NOWAIT", (key,))
    except psycopg.errors.LockNotAvailable:
        return True
    return False


@pytest.mark.parametrize("held", range(len(LOCK_ORDER)), ids=[t for t, _ in LOCK_ORDER])
def test_the_claim_locks_run_attempt_worker_then_lease_in_order_before_writing(
    pg: Harness, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queued run whose Run, Attempt, worker or lease row another connection holds locked (for
    # the lease row: the attempt's first lease expired unstarted, so the claim reacquires that row)
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    _, _, (run,) = queued(pg.db)
    attempt_id = pg.db.raw("SELECT id FROM run_attempts WHERE run_id = ?", (run.id,))[0]["id"]
    if LOCK_ORDER[held][0] == "run_leases":
        _expired_unstarted(pg, [(run.id, attempt_id)])
    keys = {"runs": run.id, "run_attempts": attempt_id, "workers": "w1", "run_leases": attempt_id}
    before = (pg.db.raw("SELECT * FROM run_leases"), count(pg.db, "run_events"))
    # The claim's own database waits longer than the checks below take (the default lock_timeout is 1 s).
    monkeypatch.setattr(
        "ql3.storage.postgres.adapter._OPTIONS", "-c statement_timeout=30000 -c lock_timeout=20000"
    )
    claimer = PostgresDatabase(pg.db.dsn, min_size=1, max_size=1)
    outcome: list[Any] = []
    table, column = LOCK_ORDER[held]
    try:
        with psycopg.connect(pg.db.dsn) as holder:
            holder.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE", (keys[table],))
            me = holder.info.backend_pid

            def claim() -> None:
                try:
                    outcome.append(_claim(Harness(db=claimer, dialect="postgres"), run.id, attempt_id).status)
                except Exception as exc:  # reported by the assertion below
                    outcome.append(exc)

            # When a claim runs meanwhile
            worker = threading.Thread(target=claim)
            worker.start()
            with psycopg.connect(pg.db.dsn, autocommit=True) as watch:
                waiter = _waiter_on(watch, me, "ql3_claim", "the claim never waited on the held row")
                # Then it waits on that row, holding exactly the rows before it in the order
                assert _tuple_locks_of(watch, waiter) == [table]
                # (a lease row that does not exist yet is neither)
                others = [
                    (i, t, c)
                    for i, (t, c) in enumerate(LOCK_ORDER)
                    if i != held and (t != "run_leases" or before[0])
                ]
                holds = {t: _locked_elsewhere(watch, t, c, keys[t]) for _, t, c in others}
                assert holds == {t: i < held for i, t, _ in others}
                # And it wrote nothing yet
                assert (pg.db.raw("SELECT * FROM run_leases"), count(pg.db, "run_events")) == before
            holder.rollback()
        worker.join(30)
    finally:
        claimer.close()

    # And once the lock is released, the claim goes through
    assert outcome == ["claimed"]
    assert count(pg.db, "run_leases") == 1


# A result's rows (ql3_lease_result, migration 0014, as ql3_fence_rows of migration 0012 for the
# path it defers to): Run, Attempt and lease locked in this order inside one statement, the worker
# read without a lock.
FENCE_LOCK_ORDER = [("runs", "id"), ("run_attempts", "id"), ("run_leases", "attempt_id")]


@pytest.mark.parametrize("held", range(len(FENCE_LOCK_ORDER)), ids=[t for t, _ in FENCE_LOCK_ORDER])
def test_the_starting_ack_locks_run_attempt_then_lease_in_order(
    pg: Harness, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claimed attempt whose Run, Attempt or lease row another connection holds locked
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    queued(pg.db)
    offer = dispatcher(pg.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None
    f = offer.fence
    keys = {"runs": f.run_id, "run_attempts": f.attempt_id, "run_leases": f.attempt_id}
    before = count(pg.db, "run_events")
    monkeypatch.setattr(
        "ql3.storage.postgres.adapter._OPTIONS", "-c statement_timeout=30000 -c lock_timeout=20000"
    )
    acker = PostgresDatabase(pg.db.dsn, min_size=1, max_size=1)
    outcome: list[Any] = []
    table, column = FENCE_LOCK_ORDER[held]
    try:
        with psycopg.connect(pg.db.dsn) as holder:
            holder.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE", (keys[table],))
            me = holder.info.backend_pid

            def ack() -> None:
                try:
                    outcome.append(acker.transaction(lambda tx: lease_results.ack_starting(tx, f))[0])
                except Exception as exc:  # reported by the assertion below
                    outcome.append(exc)

            # When the starting ACK runs meanwhile
            worker = threading.Thread(target=ack)
            worker.start()
            with psycopg.connect(pg.db.dsn, autocommit=True) as watch:
                waiter = _waiter_on(watch, me, "ql3_lease_result", "the ACK never waited on the held row")
                # Then it waits on that row, holding exactly the rows before it in the order
                assert _tuple_locks_of(watch, waiter) == [table]
                others = [(i, t, c) for i, (t, c) in enumerate(FENCE_LOCK_ORDER) if i != held]
                holds = {t: _locked_elsewhere(watch, t, c, keys[t]) for _, t, c in others}
                assert holds == {t: i < held for i, t, _ in others}
                # And it wrote nothing yet
                assert count(pg.db, "run_events") == before
            holder.rollback()
        worker.join(30)
    finally:
        acker.close()

    # And once the lock is released, the ACK goes through
    assert outcome == ["starting"]


def test_a_result_reads_the_worker_row_without_waiting_for_its_lock(pg: Harness) -> None:
    # Given a claimed attempt whose worker row another connection holds locked
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    queued(pg.db)
    offer = dispatcher(pg.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None
    f = offer.fence
    with psycopg.connect(pg.db.dsn) as holder:
        holder.execute("SELECT 1 FROM workers WHERE worker_id = %s FOR UPDATE", (f.worker_id,))

        # When the intake's lease check and the starting ACK run meanwhile (a lock wait would end in
        # the 1 s lock_timeout as StorageBusy)
        lease = pg.db.transaction(lambda tx: leases.lease_status(tx, f))
        answer, _ = pg.db.transaction(lambda tx: lease_results.ack_starting(tx, f))

        # Then both went through while the worker row stayed locked: they read it, never lock it
        assert (lease.attempt_id, answer) == (f.attempt_id, "starting")
        holder.rollback()


@pytest.fixture
def round_trips() -> Iterator[list[int]]:
    with count_round_trips() as counter:
        yield counter


# ``ql3 serve``'s dispatcher (one embedded worker): its worker snapshot is the cycle's last read and
# travels with the COMMIT.
ROUND_TRIPS_PER_LOCAL_OFFER = 3


def test_one_offer_to_the_embedded_worker_costs_a_bounded_number_of_round_trips(
    pg: Harness, round_trips: list[int]
) -> None:
    # Given serve's dispatcher for its one local worker and queued runs, past statement preparation
    register(pg.db, "local", slots=64, lease_ms=600_000)
    queued(pg.db, n=12)
    d = RunDispatcher(
        pg.db,
        lease_secret=SECRET,
        budget=DispatchBudget(lease_ms=600_000),
        incarnation_started_ms=0,
        local_worker_id="local",
    )
    for _ in range(10):
        assert d.dispatch_once().offer is not None

    # When one more offer is made
    round_trips[0] = 0
    assert d.dispatch_once().offer is not None

    # Then it took at most the budgeted exchanges with the server
    assert round_trips[0] <= ROUND_TRIPS_PER_LOCAL_OFFER, round_trips[0]


def test_one_offer_costs_a_bounded_number_of_round_trips(pg: Harness, round_trips: list[int]) -> None:
    # Given 16 workers (two snapshot pages) and queued runs, past statement preparation
    for i in range(16):
        register(pg.db, f"w{i:02d}", slots=64, lease_ms=600_000)
    queued(pg.db, n=20)
    d = dispatcher(pg.db, lease_ms=600_000)
    for _ in range(10):
        assert d.dispatch_once().offer is not None

    # When one more offer is made
    round_trips[0] = 0
    assert d.dispatch_once().offer is not None

    # Then it took at most the budgeted exchanges with the server
    assert round_trips[0] <= ROUND_TRIPS_PER_OFFER, round_trips[0]


def test_a_cycle_of_several_offers_costs_the_round_trips_of_one(pg: Harness, round_trips: list[int]) -> None:
    # Given 16 workers (two snapshot pages) and queued runs, past statement preparation
    for i in range(16):
        register(pg.db, f"w{i:02d}", slots=64, lease_ms=600_000)
    queued(pg.db, n=4 * OFFERS_PER_BATCH)
    d = dispatcher(pg.db, lease_ms=600_000, max_offers_per_cycle=OFFERS_PER_BATCH)
    for _ in range(2):
        assert len(d.dispatch_once().offers) == OFFERS_PER_BATCH

    # When one more cycle makes its offers
    round_trips[0] = 0
    assert len(d.dispatch_once().offers) == OFFERS_PER_BATCH

    # Then the whole batch took at most the budgeted exchanges with the server
    assert round_trips[0] <= ROUND_TRIPS_PER_BATCH, round_trips[0]


@contextmanager
def _batch_waiting_on(
    pg: Harness, monkeypatch: pytest.MonkeyPatch, table: str, column: str, key: str
) -> Iterator[tuple[psycopg.Connection[Any], list[Any]]]:
    """One dispatch cycle (up to 8 claims, one ``ql3_claim_batch`` call) on its own connection, started
    while another connection holds the row ``table.column = key`` locked. Yields a watching connection
    once the cycle waits on that row, and the cycle's outcome (its offer count, or its error), filled in
    once the block has ended and the lock is released."""
    # The claim's own database waits longer than the checks take (the default lock_timeout is 1 s).
    monkeypatch.setattr(
        "ql3.storage.postgres.adapter._OPTIONS", "-c statement_timeout=30000 -c lock_timeout=20000"
    )
    claimer = PostgresDatabase(pg.db.dsn, min_size=1, max_size=1)
    d = dispatcher(claimer, lease_ms=600_000, max_offers_per_cycle=8)
    outcome: list[Any] = []

    def claim() -> None:
        try:
            outcome.append(len(d.dispatch_once().offers))
        except Exception as exc:  # reported by the caller's assertion
            outcome.append(exc)

    try:
        with psycopg.connect(pg.db.dsn) as holder:
            holder.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE", (key,))
            worker = threading.Thread(target=claim)
            worker.start()
            with psycopg.connect(pg.db.dsn, autocommit=True) as watch:
                _waiter_on(
                    watch, holder.info.backend_pid, "ql3_claim_batch", f"the batch never waited on {table}"
                )
                yield watch, outcome
            holder.rollback()
        worker.join(30)
    finally:
        claimer.close()


@pytest.mark.parametrize("held", ["second_run", "worker"])
def test_a_batch_locks_its_runs_then_its_attempts_then_the_worker(
    pg: Harness, held: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two queued runs for one worker, and another connection holding the second Run's row (or
    # the worker's) locked; for the worker, the first run's attempt has a lease row already (its first
    # lease expired unstarted), which a single claim locks after the worker
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    _, _, (first, second) = queued(pg.db, n=2)
    runs_by_id = sorted([first.id, second.id])
    attempts = {str(r["run_id"]): str(r["id"]) for r in pg.db.raw("SELECT id, run_id FROM run_attempts")}
    leases_before = 0
    if held == "worker":
        first_attempt = attempts[runs_by_id[0]]
        _expired_unstarted(pg, [(runs_by_id[0], first_attempt)])
        leases_before = 1
    table, column, key = (
        ("runs", "id", runs_by_id[1]) if held == "second_run" else ("workers", "worker_id", "w1")
    )

    # When one cycle claims both
    with _batch_waiting_on(pg, monkeypatch, table, column, key) as (watch, outcome):
        # Then it waits holding the rows of the levels before, all of them, and none after
        held_now = {
            "first run": _locked_elsewhere(watch, "runs", "id", runs_by_id[0]),
            "attempts": _locked_elsewhere(watch, "run_attempts", "id", attempts[runs_by_id[0]]),
            "worker": held == "worker" or _locked_elsewhere(watch, "workers", "worker_id", "w1"),
        }
        if held == "second_run":
            assert held_now == {"first run": True, "attempts": False, "worker": False}
        else:
            second_attempt = attempts[runs_by_id[1]]
            assert held_now == {"first run": True, "attempts": True, "worker": True}
            assert _locked_elsewhere(watch, "run_attempts", "id", second_attempt)
            # the lease level comes after the workers': its row is not locked yet
            assert not _locked_elsewhere(watch, "run_leases", "attempt_id", first_attempt)
        assert count(pg.db, "run_leases") == leases_before

    # And once the lock is released, both are claimed
    assert outcome == [2]
    assert count(pg.db, "run_leases") == 2


def test_a_batch_locks_its_earlier_lease_rows_by_attempt_id_before_any_claim(
    pg: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two queued runs whose attempts both have a lease row to reacquire, the one with the larger
    # attempt id first in the queue, and another connection holding that lease row locked
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    _, _, created = queued(pg.db, n=2)
    by_attempt = sorted(
        (str(r["id"]), str(r["run_id"])) for r in pg.db.raw("SELECT id, run_id FROM run_attempts")
    )
    (small_attempt, small_run), (large_attempt, large_run) = by_attempt
    _expired_unstarted(pg, [(small_run, small_attempt), (large_run, large_attempt)])
    pg.db.raw("UPDATE runs SET priority = 1 WHERE id = ?", (large_run,))

    # When one cycle claims both (the held run first, in queue order)
    with _batch_waiting_on(pg, monkeypatch, "run_leases", "attempt_id", large_attempt) as (watch, outcome):
        # Then it waits on it holding the other lease row, the one with the smaller attempt id: the
        # lease level is locked in attempt id order before the claims run in queue order
        assert _locked_elsewhere(watch, "run_leases", "attempt_id", small_attempt)

    # And once the lock is released, both are claimed again
    assert outcome == [2]
    assert len(created) == count(pg.db, "run_leases") == 2


# Each step is one round trip: BEGIN, the clock, one statement and COMMIT in one pipeline
# (PostgresTransaction.one_then_commit). The intake's lease check (lease_status): the lease locked and
# the worker read (one ql3_fence_rows call), checked after the commit (it writes nothing).
# ack_starting, ack_running, complete: one ql3_lease_result call (migration 0014), which checks the
# fence and the states and writes the Attempt and Run, the events, and for the completion the lease
# with its slot. They were 9, 9 and 13 (Run CAS, Attempt CAS and one exchange per event, and the lease
# locked a second time), then 7, 6 and 9 (the Run, Attempt, lease and worker read one by one, the
# revision, the slot apart), then 2, 3, 3 and 5 (ql3_fence_rows, ql3_write_run, the notification rules,
# the lease write and COMMIT apart).
ROUND_TRIPS_PER_ACK = {"lease_check": 1, "starting": 1, "running": 1, "complete": 1}


@pytest.mark.parametrize("timeout_ms", [None, 60_000], ids=["no_timeout", "timeout"])
def test_the_acks_and_the_completion_cost_a_bounded_number_of_round_trips(
    pg: Harness, round_trips: list[int], timeout_ms: int | None
) -> None:
    # Given offers past statement preparation (of a task with or without a timeout, which the
    # starting ACK turns into the attempt's deadline in the same call)
    register(pg.db, "w1", slots=64, lease_ms=600_000)
    queued(pg.db, n=4, **({} if timeout_ms is None else {"timeout_ms": timeout_ms}))
    d = dispatcher(pg.db, lease_ms=600_000)
    spent: dict[str, list[int]] = {"lease_check": [], "starting": [], "running": [], "complete": []}
    for _ in range(4):
        offer = d.dispatch_once().offer
        assert offer is not None
        f = offer.fence
        steps = {
            "lease_check": lambda tx, f=f: leases.lease_status(tx, f),
            "starting": lambda tx, f=f: lease_results.ack_starting(tx, f),
            "running": lambda tx, f=f: lease_results.ack_running(
                tx,
                f,
                pid=4242,
                handle="ql3lp1.test",
                log_artifact_id="a",
                callback_sequence=1,
                callback_token_digest=sha256_hex("cb-token"),
            ),
            "complete": lambda tx, f=f: lease_results.complete(
                tx, f, callback_sequence=1, callback_token="cb-token", exit_code=0
            ),
        }
        # When each step of the run commits
        for name, step in steps.items():
            round_trips[0] = 0
            pg.db.transaction(step)
            spent[name].append(round_trips[0])

    # Then, once prepared, each took at most its budget of exchanges with the server
    assert all(n <= ROUND_TRIPS_PER_ACK[name] for name, ns in spent.items() for n in ns[1:]), spent
