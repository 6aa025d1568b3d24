"""A remote worker cut off from its replica (a TCP proxy the test controls) past its lease: it stops
its own process before the lease can expire, the run is retried on another worker once lost, no two
copies ever run at once, and what the cut-off worker sends once it is back is refused by the fence
(docs/cluster.md "The remote worker")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.cluster import Cluster, P, TcpProxy, add_task, start_runs, wait_terminal
from tests.support.databases import PgDatabase

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
LEASE = {"QL3_RUN_LEASE_MS": "5000"}


@pytest.fixture
def cluster(tmp_path: Path, pg_database: PgDatabase) -> Iterator[Cluster]:
    c = Cluster(base=tmp_path, db_url=pg_database.url)
    try:
        c.start_replica("cp-a", env=LEASE)
        yield c
    finally:
        c.stop_all()


def test_a_cut_off_worker_stops_its_run_and_its_late_calls_are_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given a worker reaching the replica through a proxy, running a run that may be retried
    port = urlsplit(cluster.replicas[0].url).port
    assert port is not None
    proxy = TcpProxy(port)
    cluster.start_worker("w1", 0, "--slots", "1", server=proxy.url, env=LEASE)
    ledger, pids = tmp_path / "ledger", tmp_path / "pids"
    pids.mkdir()
    command = (
        f'for p in {pids}/*; do [ -e "$p" ] && kill -0 "$(cat "$p")" 2>/dev/null'
        f' && echo "$QL3_ATTEMPT_ID saw-another-copy" >> {ledger}; done; '
        f'echo $$ > {pids}/$QL3_ATTEMPT_ID; echo "$QL3_ATTEMPT_ID start" >> {ledger}; '
        f'sleep 6; echo "$QL3_ATTEMPT_ID end" >> {ledger}'
    )
    with cluster.api(0) as api:
        add_task(api, "cutoff", command, max_attempts=2, retry_safe=True)
        [run_id] = start_runs(api, "cutoff", 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (ledger.exists() and "start" in ledger.read_text()):
            time.sleep(0.05)
        first = ledger.read_text().split()[0]

        # When the link is cut, and another worker is there to take the run over
        proxy.cut()
        cluster.start_worker("w2", 0, "--slots", "1", env=LEASE)

        # Then the run succeeds on a second attempt, and the first copy never overlapped it
        statuses = wait_terminal(api, [run_id])
        assert statuses[run_id] == "succeeded", cluster.logs()
        lines = ledger.read_text().splitlines()
        assert not any("saw-another-copy" in line for line in lines), lines
        assert f"{first} end" not in lines  # the cut-off worker stopped its own process
        ends = [line for line in lines if line.endswith(" end")]
        assert len(ends) == 1 and not ends[0].startswith(first)
        attempts = api.get(f"{P}/runs/{run_id}").json()
        assert attempts["status"] == "succeeded"

        # And once the link is back and the cut-off worker is heard from again (its session lease
        # had run out meanwhile), what it sends for the old attempt changes nothing
        assert api.get(f"{P}/workers/w1").json()["status"] == "expired"
        proxy.restore()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and api.get(f"{P}/workers/w1").json()["status"] != "online":
            time.sleep(0.1)
        assert api.get(f"{P}/workers/w1").json()["status"] == "online", cluster.logs()
        time.sleep(1.0)  # a late completion or renewal of the first attempt would land by now
        final = api.get(f"{P}/runs/{run_id}").json()
        assert (final["status"], final["attempt"]) == ("succeeded", 2)
        items = api.get(f"{P}/runs/{run_id}/events", params={"limit": 200}).json()["items"]
        assert [e["type"] for e in items].count("run.succeeded") == 1
        assert f"{first} end" not in ledger.read_text().splitlines()
    proxy.cut()
