"""PostgreSQL failover under a cluster (ADR-0005 gate 12, docs/cluster.md): a throwaway primary with
a synchronous streaming standby, made by the test from PostgreSQL 15's server binaries as the
``postgres`` user; the primary is stopped mid-load and the standby promoted. Replicas (one
multi-host DSN with ``target_session_attrs=read-write``) and workers reconnect, every committed run
is there, and every run succeeds exactly once. A cancellation dispatch claimed on the old primary by
a holder that was then killed is fenced on the new one: the holder's stale result (its owner, token
and version) is refused, a new holder completes the stop, and the run's whole process group is gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ql3.application import cancellation
from ql3.domain.errors import FenceConflict
from ql3.execution.identity import ProcessHandle
from ql3.storage.postgres.adapter import PostgresDatabase
from tests.support.cluster import Cluster, P, add_task, start_runs, wait_terminal
from tests.support.databases import pg_admin_dsn
from tests.support.server import free_port
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# Long enough that the promotion comes before the dead holder's lease ends (checked below).
HOLDER_LEASE_MS = 10_000
# A cancellation holder in a process of its own: it commits the run's stop intent and claims its
# dispatch in one transaction (so no worker claims it first), prints its fence, and waits to be killed.
HOLDER = """
import json, secrets, sys
from ql3.application import cancellation, runs
from ql3.storage.postgres.adapter import PostgresDatabase

url, project_id, run_id, lease_ms = sys.argv[1:5]
db = PostgresDatabase(url, min_size=1, max_size=1)
token = secrets.token_urlsafe(32)


def unit(tx):
    asked = cancellation.request_cancel(tx, project_id, run_id, reason="user", actor_type="user")
    assert asked == "requested", asked
    intent = runs.get_run(tx, project_id, run_id).cancel_requested_at_ms
    return cancellation.claim(
        tx, run_id=run_id, owner="doomed-holder", token=token, lease_ms=int(lease_ms), requested_at_ms=intent
    )


claim = db.transaction(unit)
assert claim.status == "claimed", claim
fence = {
    "attempt_id": claim.attempt_id,
    "version": claim.dispatch_version,
    "token": token,
    "expires_at_ms": claim.lease_expires_at_ms,
}
print(json.dumps(fence), flush=True)
sys.stdin.read()
"""


@dataclass
class PgPair:
    base: Path
    primary_port: int
    standby_port: int

    def ctl(self, *args: str) -> None:
        as_postgres(str(PG_BIN / "pg_ctl"), *args)

    @property
    def url(self) -> str:
        hosts = f"127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
        return f"postgresql://postgres@{hosts}/ql3?target_session_attrs=read-write"


def as_postgres(*argv: str) -> None:
    prefix = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)


def _group_alive(pgid: int) -> bool:
    """Whether any live process is in process group ``pgid``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _pgid(url: str, run_id: str) -> int:
    """The process group of the run's latest attempt, from its stored handle."""
    db = PostgresDatabase(url, min_size=1, max_size=1)
    try:
        rows = db.raw(
            "SELECT executor_handle FROM run_attempts WHERE run_id = ? ORDER BY attempt DESC LIMIT 1",
            (run_id,),
        )
    finally:
        db.close()
    return ProcessHandle.decode(str(rows[0]["executor_handle"])).pgid


def _claimed_by_a_holder_then_killed(url: str, project_id: str, run_id: str) -> dict[str, object]:
    """Cancel ``run_id`` and claim its dispatch in a process of its own, then kill -9 that process."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, project_id, run_id, str(HOLDER_LEASE_MS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stderr is not None
            line = holder.stdout.readline()
            assert line, holder.stderr.read()
            fence: dict[str, object] = json.loads(line)
        finally:
            holder.kill()
            holder.wait(timeout=30)
    return fence


@pytest.fixture
def pg_pair() -> Iterator[PgPair]:
    if pg_admin_dsn() is None:
        pytest.skip("PostgreSQL not configured (QL3_TEST_PG_DSN)")
    missing = not (PG_BIN / "initdb").exists() or (os.geteuid() == 0 and shutil.which("runuser") is None)
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL 15 server binaries (and runuser as root) are needed under CI=true")
        pytest.skip("PostgreSQL 15 server binaries are not installed")
    # Outside pytest's private temp tree, which the postgres user cannot traverse.
    base = Path(tempfile.mkdtemp(prefix="ql3-pg-failover-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    pair = PgPair(base=base, primary_port=free_port(), standby_port=free_port())
    primary, standby = base / "primary", base / "standby"
    as_postgres(str(PG_BIN / "initdb"), "-D", str(primary), "-A", "trust", "-U", "postgres")
    with (primary / "postgresql.conf").open("a") as conf:
        conf.write(
            f"port = {pair.primary_port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{base}'\nwal_level = replica\nmax_wal_senders = 4\n"
            "synchronous_standby_names = '*'\n"  # a commit is acknowledged once the standby has it
        )
    with (primary / "pg_hba.conf").open("a") as hba:
        hba.write("host replication postgres 127.0.0.1/32 trust\n")
    try:
        pair.ctl("-D", str(primary), "-l", str(base / "primary.log"), "-w", "start")
        as_postgres(
            str(PG_BIN / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(pair.primary_port),
            "-U",
            "postgres",
            "-D",
            str(standby),
            "-R",
            "-X",
            "stream",
        )
        conf_text = (standby / "postgresql.conf").read_text()
        (standby / "postgresql.conf").write_text(
            conf_text.replace(f"port = {pair.primary_port}", f"port = {pair.standby_port}")
            # once promoted it has no standby of its own to wait for
            + "synchronous_standby_names = ''\n"
        )
        pair.ctl("-D", str(standby), "-l", str(base / "standby.log"), "-w", "start")
        as_postgres(
            str(PG_BIN / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(pair.primary_port),
            "-U",
            "postgres",
            "-c",
            "CREATE DATABASE ql3",
        )
        yield pair
    finally:
        for name in ("standby", "primary"):
            if (base / name / "postmaster.pid").exists():
                subprocess.run(
                    [
                        "runuser",
                        "-u",
                        "postgres",
                        "--",
                        str(PG_BIN / "pg_ctl"),
                        "-D",
                        str(base / name),
                        "-m",
                        "immediate",
                        "stop",
                    ]
                    if os.geteuid() == 0
                    else [str(PG_BIN / "pg_ctl"), "-D", str(base / name), "-m", "immediate", "stop"],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        shutil.rmtree(base, ignore_errors=True)


def test_a_promoted_standby_carries_the_cluster_on_and_no_run_is_lost_or_doubled(
    tmp_path: Path, pg_pair: PgPair
) -> None:
    # Given two replicas and two workers on the primary, with a synchronous standby behind it
    cluster = Cluster(base=tmp_path, db_url=pg_pair.url)
    try:
        cluster.start_replica("cp-a")
        cluster.start_replica("cp-b")
        a_url, b_url = cluster.replicas[0].url, cluster.replicas[1].url
        cluster.start_worker("w1", 0, "--slots", "3", "--server", b_url)
        cluster.start_worker("w2", 1, "--slots", "3", "--server", a_url)
        ledger = tmp_path / "ledger"
        child = tmp_path / "child.pid"
        with cluster.api(0) as api:
            # And a run whose process group (a shell and its child) runs until it is stopped
            add_task(api, "stubborn", f"sleep 300 & echo $! > {child}; wait", grace_ms=1000)
            stubborn = api.post(f"{P}/tasks/stubborn/runs", json={}).json()
            wait_for(lambda: child.exists() and child.read_text().strip(), what="the stubborn run's child")
            # And its cancellation dispatch claimed on the primary by a holder that is then killed
            claimed_at = time.monotonic()
            old = _claimed_by_a_holder_then_killed(pg_pair.url, stubborn["project_id"], stubborn["id"])
            shown = api.get(f"{P}/runs/{stubborn['id']}").json()
            assert shown["status"] == "running" and shown["cancel_requested_at_ms"] is not None
            pgid = _pgid(pg_pair.url, stubborn["id"])
            assert _group_alive(pgid), "the killed holder signalled nothing"
            add_task(
                api, "steady", f'sleep 0.2; echo "$QL3_RUN_ID" >> {ledger}', max_attempts=3, retry_safe=True
            )
            run_ids = start_runs(api, "steady", 40)
            wait_for(
                lambda: ledger.exists() and len(ledger.read_text().split()) >= 8, what="eight ledger entries"
            )

            # When the primary dies mid-load and the standby is promoted
            pg_pair.ctl("-D", str(pg_pair.base / "primary"), "-m", "immediate", "stop")
            pg_pair.ctl("-D", str(pg_pair.base / "standby"), "-w", "promote")
            # (while the dead holder's claim still holds: no new holder could take it over before)
            assert time.monotonic() - claimed_at < HOLDER_LEASE_MS / 1000, "promoted too late to test"

            # Then the replicas and workers carry on against the new primary: every run is there and
            # succeeds, and each executed exactly once
            statuses = wait_terminal(api, run_ids, timeout_s=90)
            assert Counter(statuses.values()) == {"succeeded": len(run_ids)}, cluster.logs()
            lines = ledger.read_text().split()
            assert sorted(lines) == sorted(run_ids), Counter(lines).most_common(3)

            # And once the dead holder's lease ran out, a new holder completed the stop: the run is
            # cancelled and its whole process group is gone
            assert wait_terminal(api, [stubborn["id"]], timeout_s=60) == {stubborn["id"]: "cancelled"}
            wait_for(lambda: not _group_alive(pgid), what="the stubborn run's process group to end")
            events = api.get(f"{P}/runs/{stubborn['id']}/events").json()["items"]
            [stop] = [e for e in events if e["type"] == "run.cancel_dispatched"]
            assert stop["actor_id"] != "doomed-holder"
            # ...never before the dead holder's lease, which the promoted standby kept, had ended
            assert stop["created_at_ms"] >= int(str(old["expires_at_ms"])), (stop, old)

        # And the dead holder's result - its owner, token and version - is refused by the new primary
        db = PostgresDatabase(pg_pair.url, min_size=1, max_size=1)
        try:
            before = db.raw("SELECT * FROM cancellation_dispatches WHERE run_id = ?", (stubborn["id"],))
            with pytest.raises(FenceConflict):
                db.transaction(
                    lambda tx: cancellation.record_result(
                        tx,
                        run_id=stubborn["id"],
                        attempt_id=str(old["attempt_id"]),
                        owner="doomed-holder",
                        token=str(old["token"]),
                        expected_version=int(str(old["version"])),
                        result="termination_requested",
                        controller_ran=True,
                    )
                )
            after = db.raw("SELECT * FROM cancellation_dispatches WHERE run_id = ?", (stubborn["id"],))
            assert after == before and before[0]["status"] == "dispatched"
            assert int(before[0]["version"]) > int(str(old["version"]))  # the new holder's takeover
        finally:
            db.close()
    finally:
        cluster.stop_all()
