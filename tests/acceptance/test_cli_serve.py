"""``ql3 serve`` and ``ql3 init``: first start, credentials, restart, clean stop, the db commands."""

from __future__ import annotations

import signal
import stat
from pathlib import Path

import httpx
import pytest

from tests.support.server import Server, run_cli, start_server, stop

pytestmark = pytest.mark.slow


def test_first_start_writes_owner_credentials_with_mode_0600(serve: Server) -> None:
    path = serve.home / "credentials"

    creds = serve.credentials()

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert creds["url"] == serve.url
    resp = httpx.get(f"{serve.url}/api/v1/projects", headers={"Authorization": f"Bearer {creds['token']}"})
    assert resp.status_code == 200


def test_readyz_reports_ready_with_each_loop_s_age(serve: Server) -> None:
    body = httpx.get(f"{serve.url}/readyz").json()

    assert body["status"] == "ready"
    assert set(body["loops"]) == {
        "dispatcher",
        "notifications",
        "retention",
        "worker-maintain",
        "lease-expiry",
        "cancellation",
        "approved-actions",
        "cron",
        "subscriptions",
    }
    assert all(not loop["stuck"] and loop["age_s"] is not None for loop in body["loops"].values())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_cleanly(serve: Server, sig: int) -> None:
    code = stop(serve.process, sig)

    assert code == 0
    assert "Application shutdown complete" in serve.log()


def test_a_restart_keeps_the_owner_token_and_updates_the_url(tmp_path: Path) -> None:
    # Given a server that ran once and stopped
    home = tmp_path / "home"
    first = start_server(home)
    token = first.credentials()["token"]
    stop(first.process)

    # When it starts again on another port
    second = start_server(home)
    try:
        creds = second.credentials()
        # Then the token is unchanged and the URL follows the new listen address
        assert creds == {"url": second.url, "token": token}
        assert second.cli("task", "list").returncode == 0
    finally:
        stop(second.process)


def test_init_creates_the_database_and_credentials(tmp_path: Path) -> None:
    home = tmp_path / "home"

    done = run_cli("init", "--json", home=home)
    status = run_cli("db", "status", "--json", home=home)

    assert done.returncode == 0
    assert stat.S_IMODE((home / "credentials").stat().st_mode) == 0o600
    assert status.returncode == 0
    assert '"pending": 0' in status.stdout


def test_init_twice_keeps_the_first_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_cli("init", home=home)
    first = (home / "credentials").read_text()

    again = run_cli("init", home=home)

    assert again.returncode == 0
    assert "already initialised" in again.stdout
    assert (home / "credentials").read_text() == first


def test_db_migrate_on_a_given_database_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"

    migrated = run_cli("db", "migrate", "--database-url", url, "--json", home=tmp_path / "home")
    again = run_cli("db", "migrate", "--json", home=tmp_path / "home", env={"QL3_DATABASE_URL": url})

    assert migrated.returncode == 0
    assert '"applied": [\n    1' in migrated.stdout
    assert again.returncode == 0
    assert '"applied": []' in again.stdout


def test_an_unsupported_database_url_exits_1(tmp_path: Path) -> None:
    done = run_cli("db", "status", "--database-url", "mysql://nope", home=tmp_path)

    assert done.returncode == 1
    assert done.stderr.startswith("error: configuration_error:")
