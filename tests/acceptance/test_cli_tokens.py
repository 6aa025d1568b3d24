"""``ql3 token create``: a token with a role, printed once, enforced by the server."""

from __future__ import annotations

import pytest

from .conftest import Server

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
