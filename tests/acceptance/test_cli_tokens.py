"""``ql3 token create``: a token with a role, printed once, enforced by the server."""

from __future__ import annotations

import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow


def test_a_viewer_token_cannot_create_tasks(shared_server: Server) -> None:
    # Given a viewer token created by the owner
    issued = shared_server.cli_json("token", "create", "--role", "viewer", "--name", "dashboard")
    viewer = {"QL3_TOKEN": issued["token"]}

    # When the viewer tries to add a task
    done = shared_server.cli("task", "add", "forbidden", "--command", "true", env=viewer)

    # Then the server refuses with permission_denied and the CLI exits 1
    assert done.returncode == 1
    assert done.stderr.startswith("error: permission_denied:")
    owner_view = shared_server.cli_json("task", "list")
    assert "forbidden" not in [t["name"] for t in owner_view["items"]]


def test_a_viewer_token_can_read(shared_server: Server) -> None:
    issued = shared_server.cli_json("token", "create", "--role", "viewer")

    listed = shared_server.cli("task", "list", "--json", env={"QL3_TOKEN": issued["token"]})

    assert listed.returncode == 0


def test_an_operator_token_can_start_runs(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "operated", "--command", "true")
    issued = shared_server.cli_json("token", "create", "--role", "operator")

    done = shared_server.cli("run", "start", "operated", "--json", env={"QL3_TOKEN": issued["token"]})

    assert done.returncode == 0


def test_a_viewer_cannot_create_tokens(shared_server: Server) -> None:
    issued = shared_server.cli_json("token", "create", "--role", "viewer")

    done = shared_server.cli("token", "create", "--role", "admin", env={"QL3_TOKEN": issued["token"]})

    assert done.returncode == 1
    assert done.stderr.startswith("error: permission_denied:")


def test_human_token_create_prints_only_the_token_on_stdout(shared_server: Server) -> None:
    done = shared_server.cli("token", "create", "--role", "viewer")

    assert done.returncode == 0
    assert done.stdout.startswith("ql3_")
    assert len(done.stdout.strip().splitlines()) == 1
    assert "shown only this once" in done.stderr


def test_whoami_prints_the_name_and_roles(shared_server: Server) -> None:
    issued = shared_server.cli_json("token", "create", "--role", "approver", "--name", "reviewer")

    done = shared_server.cli("whoami", env={"QL3_TOKEN": issued["token"]})

    assert done.returncode == 0, done.stderr
    assert "reviewer" in done.stdout
    assert "role in default  approver" in done.stdout
    owner = shared_server.cli_json("whoami")
    assert owner["is_owner"] is True and owner["roles"]["default"] == "admin"


def test_list_then_revoke_refuses_the_token_at_once(shared_server: Server) -> None:
    issued = shared_server.cli_json("token", "create", "--role", "viewer", "--name", "leaked")
    member = {"QL3_TOKEN": issued["token"]}
    assert shared_server.cli("task", "list", env=member).returncode == 0
    listed = shared_server.cli("token", "list")
    assert listed.returncode == 0 and issued["principal_id"] in listed.stdout
    assert issued["token"] not in listed.stdout

    revoked = shared_server.cli("token", "revoke", issued["principal_id"])

    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout
    refused = shared_server.cli("task", "list", env=member)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: unauthenticated:")
    rows = {t["id"]: t for t in shared_server.cli_json("token", "list")["items"]}
    assert rows[issued["principal_id"]]["revoked_at_ms"] is not None


def test_rotating_another_token_prints_it_and_leaves_the_credentials_alone(shared_server: Server) -> None:
    issued = shared_server.cli_json("token", "create", "--role", "viewer", "--expires-in", "600")
    before = (shared_server.home / "credentials").read_bytes()

    done = shared_server.cli("token", "rotate", issued["principal_id"])

    assert done.returncode == 0, done.stderr
    new_token = done.stdout.strip()
    assert new_token.startswith("ql3_") and new_token != issued["token"]
    assert (shared_server.home / "credentials").read_bytes() == before
    assert shared_server.cli("whoami", env={"QL3_TOKEN": issued["token"]}).returncode == 1
    assert shared_server.cli("whoami", env={"QL3_TOKEN": new_token}).returncode == 0


def test_a_too_short_lifetime_is_a_usage_error(shared_server: Server) -> None:
    done = shared_server.cli("token", "create", "--role", "viewer", "--expires-in", "5")

    assert done.returncode == 64


def test_rotating_the_owner_rewrites_the_credentials_file(serve: Server) -> None:
    # Given the owner's token in $QL3_HOME/credentials, as ql3 serve wrote it
    old = serve.credentials()["token"]
    owner_id = serve.cli_json("whoami")["principal_id"]

    # When the owner rotates its own token through the CLI on the server host
    rotated = serve.cli_json("token", "rotate", "me")

    # Then the file holds the new token (0600), the old one is refused, and the CLI keeps working
    assert rotated["credentials_updated"] is True and rotated["id"] == owner_id
    creds = serve.credentials()
    assert creds["token"] == rotated["token"] != old
    assert oct((serve.home / "credentials").stat().st_mode & 0o777) == "0o600"
    assert serve.cli("whoami", env={"QL3_TOKEN": old}).returncode == 1
    assert serve.cli_json("whoami")["principal_id"] == owner_id
