"""``ql3 task list --search`` and its pages through a real server (docs/cli.md, issue 32)."""

from __future__ import annotations

from tests.support.server import Server


def test_task_list_searches_on_the_server_and_pages_through_the_matches(shared_server: Server) -> None:
    # Given five tasks, three of them with "nightly" in their name
    for name in ("nightly-a", "Nightly-b", "nightly-c", "hourly", "weekly"):
        shared_server.cli_json("task", "add", name, "--command", "true")

    # When the matches are listed two at a time
    first = shared_server.cli("task", "list", "--search", "NIGHTLY", "--limit", "2")
    second = shared_server.cli_json(
        "task", "list", "--search", "NIGHTLY", "--limit", "2", "--cursor", "nightly-a"
    )

    # Then the first page holds two matches and a hint that keeps the search for the next page
    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()[1:]] == ["Nightly-b", "nightly-a"]
    assert "--search NIGHTLY" in first.stderr and "--cursor nightly-a" in first.stderr
    # and the next page the last one, with nothing after it
    assert [t["name"] for t in second["items"]] == ["nightly-c"] and second["next_cursor"] is None


def test_a_search_too_long_is_refused_with_exit_64(shared_server: Server) -> None:
    done = shared_server.cli("task", "list", "--search", "x" * 129)

    assert done.returncode == 64
    assert "validation_failed" in done.stderr and "query.q" in done.stderr
