"""PostgreSQL failover under a cluster (ADR-0005 gate 12, docs/cluster.md): a throwaway primary with
a synchronous streaming standby, made by the test from PostgreSQL 15's server binaries as the
``postgres`` user; the primary is stopped mid-load and the standby promoted. Replicas (one
multi-host DSN with ``target_session_attrs=read-write``) and workers reconnect, every committed run
is there, and every run succeeds exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, add_task, start_runs, wait_terminal
from tests.support.databases import pg_admin_dsn
from tests.support.server import free_port
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


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
        with cluster.api(0) as api:
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

            # Then the replicas and workers carry on against the new primary: every run is there and
            # succeeds, and each executed exactly once
            statuses = wait_terminal(api, run_ids, timeout_s=90)
            assert Counter(statuses.values()) == {"succeeded": len(run_ids)}, cluster.logs()
            lines = ledger.read_text().split()
            assert sorted(lines) == sorted(run_ids), Counter(lines).most_common(3)
    finally:
        cluster.stop_all()
