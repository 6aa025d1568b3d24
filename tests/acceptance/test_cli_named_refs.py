"""Every CLI command that takes an id takes a unique prefix of it, and tokens, notification channels and
subscriptions also take their name: a shared name or prefix is refused listing the candidates (exit 1,
``ambiguous_id``), and nothing is changed (docs/cli.md "Names and short ids")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.server import Server, start_server, stop

pytestmark = pytest.mark.slow
SECRET = "named-refs-webhook-secret-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = start_server(tmp_path_factory.mktemp("named") / "home", "--notify-allow", "127.0.0.1")
    try:
        yield started
    finally:
        stop(started.process)


def _unique(mine: str, others: list[str]) -> str:
    """The shortest start of ``mine`` (at least 4 characters) that no other id shares."""
    longest = 0
    for other in others:
        if other == mine:
            continue
        shared = 0
        while shared < min(len(mine), len(other)) and mine[shared] == other[shared]:
            shared += 1
        longest = max(longest, shared)
    return mine[: max(4, longest + 1)]


def _tokens(server: Server) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = server.cli_json("token", "list")["items"]
    return items


def test_a_token_is_revoked_by_name_and_rotated_by_id_prefix(server: Server) -> None:
    made = server.cli_json("token", "create", "--role", "viewer", "--name", "ci-bot")
    kept = server.cli_json("token", "create", "--role", "viewer", "--name", "backup-bot")
    ids = [str(t["id"]) for t in _tokens(server)]

    rotated = server.cli_json("token", "rotate", _unique(kept["principal_id"], ids))
    revoked = server.cli_json("token", "revoke", "ci-bot")

    assert rotated["id"] == kept["principal_id"] and rotated["token"] != kept["token"]
    assert revoked["id"] == made["principal_id"] and revoked["revoked_at_ms"]
    states = {t["id"]: t["revoked_at_ms"] for t in _tokens(server)}
    assert states[kept["principal_id"]] is None


def test_a_shared_token_name_is_refused_listing_the_ids_and_revokes_nothing(server: Server) -> None:
    first = server.cli_json("token", "create", "--role", "viewer", "--name", "twin")["principal_id"]
    second = server.cli_json("token", "create", "--role", "viewer", "--name", "twin")["principal_id"]

    done = server.cli("token", "revoke", "twin")
    as_json = server.cli("token", "revoke", "twin", "--json")

    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: ambiguous_id: 'twin' names or starts several tokens: ")
    assert first in done.stderr and second in done.stderr
    error = json.loads(as_json.stderr)["error"]
    assert as_json.returncode == 1 and error["code"] == "ambiguous_id"
    assert {first, second} <= set(error["details"]["candidates"])
    states = {t["id"]: t["revoked_at_ms"] for t in _tokens(server)}
    assert states[first] is None and states[second] is None


def test_an_unknown_token_name_is_echoed_with_the_list_command(server: Server) -> None:
    done = server.cli("token", "revoke", "nobody-by-that-name")

    assert done.returncode == 1
    assert done.stderr == ("error: not_found: token 'nobody-by-that-name' not found (see: ql3 token list)\n")


def test_a_worker_is_shown_by_a_prefix_of_its_id(server: Server) -> None:
    (worker,) = server.cli_json("worker", "list")["items"]
    prefix = str(worker["id"])[:-1] if len(worker["id"]) > 4 else str(worker["id"])

    shown = server.cli_json("worker", "show", prefix)
    missing = server.cli("worker", "show", "no-such-worker-xyz")

    assert shown["id"] == worker["id"]
    assert missing.returncode == 1 and "'no-such-worker-xyz' not found" in missing.stderr


def test_channels_and_rules_are_named_by_name_or_id_prefix(server: Server) -> None:
    for name in ("ops-a", "ops-b"):
        added = server.cli(
            "notify", "channel", "add", name, "--webhook", "http://127.0.0.1:9/hook", "--secret-env", "S",
            env={"S": SECRET},
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
    channels = {c["name"]: str(c["id"]) for c in server.cli_json("notify", "channel", "list")["items"]}
    ops_b = _unique(channels["ops-b"], list(channels.values()))

    rule = server.cli_json("notify", "rule", "add", "--channel", ops_b)
    rule_ids = [str(r["id"]) for r in server.cli_json("notify", "rule", "list")["items"]]
    removed_rule = server.cli("notify", "rule", "remove", _unique(rule["id"], rule_ids))
    removed = server.cli("notify", "channel", "remove", ops_b)
    tested = server.cli("notify", "test", "ops-a", "--timeout", "1s", "--json")

    assert rule["channel"] == "ops-b"
    assert removed_rule.returncode == 0, removed_rule.stderr
    assert server.cli_json("notify", "rule", "list")["items"] == []
    assert removed.returncode == 0, removed.stderr
    assert [c["name"] for c in server.cli_json("notify", "channel", "list")["items"]] == ["ops-a"]
    assert "ambiguous_id" not in tested.stderr and "not_found" not in tested.stderr


def test_a_subscription_is_removed_by_a_prefix_of_its_id(server: Server) -> None:
    made = server.cli_json("subscription", "add", "mirror", "--repo", "file:///srv/none.git")
    other = server.cli_json("subscription", "add", "mirror-2", "--repo", "file:///srv/none2.git")

    removed = server.cli("subscription", "rm", _unique(made["id"], [made["id"], other["id"]]))
    by_name = server.cli("subscription", "rm", "mirror-2")

    assert removed.returncode == 0, removed.stderr
    assert by_name.returncode == 0, by_name.stderr
    assert server.cli_json("subscription", "list")["items"] == []
