"""``ql3 control`` and ``ql3 worker --server`` as commands: bad settings exit 64 with nothing
written, and a replica serving HTTPS with a worker trusting its CA runs a task (docs/cluster.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, add_task, start_runs, wait_terminal
from tests.support.databases import PgDatabase
from tests.support.server import run_cli

pytestmark = pytest.mark.slow


def test_control_refuses_sqlite_with_exit_64_and_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = run_cli("control", "--database-url", f"sqlite:///{tmp_path / 'x.db'}", home=home)
    assert done.returncode == 64, done.stderr
    assert "PostgreSQL" in done.stderr
    assert not (tmp_path / "x.db").exists() and not home.exists()


def test_control_needs_both_tls_files(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    done = run_cli(
        "control",
        "--database-url",
        "postgresql://nobody@127.0.0.1:1/x",
        "--tls-cert",
        str(cert),
        home=tmp_path / "home",
    )
    assert done.returncode == 64 and "--tls-key" in done.stderr


def test_worker_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    token = tmp_path / "w.token"
    token.write_text("ql3_" + "a" * 43 + "\n")
    os.chmod(token, 0o644)
    done = run_cli(
        "worker", "--server", "http://127.0.0.1:1", "--token-file", str(token), home=tmp_path / "home"
    )
    assert done.returncode == 64 and "chmod 600" in done.stderr
    missing = run_cli("worker", "--server", "http://127.0.0.1:1", home=tmp_path / "home")
    assert missing.returncode == 64 and "--token-file" in missing.stderr
    nothing = run_cli("worker", home=tmp_path / "home")
    assert nothing.returncode == 64


@pytest.mark.postgres
def test_a_replica_serves_https_and_a_worker_trusting_its_ca_runs_a_task(
    tmp_path: Path, pg_database: PgDatabase
) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("openssl is needed for the TLS test under CI=true")
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    cluster = Cluster(base=tmp_path, db_url=pg_database.url)
    try:
        replica = cluster.start_replica(
            "cp-tls", extra=("--tls-cert", str(cert), "--tls-key", str(key)), ca=str(cert)
        )
        assert replica.url.startswith("https://")
        token = cluster.worker_token("w1", env={"SSL_CERT_FILE": str(cert)})
        cluster.start_worker("w1", 0, "--ca", str(cert), token_file=token)
        with cluster.api(0) as api:
            add_task(api, "secure", "true")
            run_ids = start_runs(api, "secure", 3)
            assert set(wait_terminal(api, run_ids).values()) == {"succeeded"}, cluster.logs()
        # and a client that does not trust the CA is refused by the TLS handshake
        untrusting = run_cli(
            "worker",
            "token",
            "list",
            home=cluster.owner_home,
            env={"QL3_URL": replica.url, "QL3_TOKEN": cluster.token()},
        )
        assert untrusting.returncode != 0
    finally:
        cluster.stop_all()
