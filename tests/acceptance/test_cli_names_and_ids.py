"""The CLI speaks names and short ids: task and principal names in tables, any unique id prefix
accepted where an id is, tables at most 100 columns, ``-q`` for ids only, a next-page hint that keeps
the listing's options, and not-found errors that echo the name and suggest the closest one."""

from __future__ import annotations

import json

import pytest

from tests.support.server import Server
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _wait_terminal(server: Server, run_id: str) -> dict[str, object]:
    def terminal() -> dict[str, object] | None:
        run: dict[str, object] = server.cli_json("run", "show", run_id)
        return run if run["status"] in ("succeeded", "failed", "timed_out", "cancelled") else None

    return wait_for(terminal, 60, what=f"run {run_id} to end")


def _shared_prefix(ids: list[str]) -> str:
    shared = ids[0]
    for other in ids[1:]:
        while not other.startswith(shared):
            shared = shared[:-1]
    return shared


def test_run_list_shows_task_names_and_short_ids_within_100_columns(shared_server: Server) -> None:
    # Given runs of a task with a long name
    shared_server.cli_json("task", "add", "nightly-backup-of-the-whole-media-library", "--command", "true")
    started = shared_server.cli_json("run", "start", "nightly-backup-of-the-whole-media-library")
    _wait_terminal(shared_server, started["id"])

    # When the runs are listed for people
    done = shared_server.cli("run", "list", "--task", "nightly-backup-of-the-whole-media-library")

    # Then the row names the task (not its UUID), shows a short id and fits 100 columns
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "TASK", "REV", "STATUS"]
    row = lines[1]
    assert row.startswith(started["id"][:13] + " ") and started["id"] not in row
    assert "nightly-backup" in row and started["task_id"] not in row
    assert "succeeded" in row and "\x1b[" not in row  # piped: no colours
    assert all(len(line) <= 100 for line in lines)


def test_a_unique_id_prefix_is_accepted_where_a_run_id_is(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "prefixed", "--command", "echo from-prefixed")
    first = shared_server.cli_json("run", "start", "prefixed")["id"]
    second = shared_server.cli_json("run", "start", "prefixed")["id"]
    _wait_terminal(shared_server, first)
    _wait_terminal(shared_server, second)
    unique = second[: len(_shared_prefix([first, second])) + 1]

    shown = shared_server.cli_json("run", "show", unique)
    logs = shared_server.cli("run", "logs", unique)
    events = shared_server.cli_json("run", "events", unique)

    assert shown["id"] == second
    assert logs.returncode == 0 and "from-prefixed" in logs.stdout
    assert events["items"] and events["items"][0]["run_id"] == second


def test_an_ambiguous_prefix_lists_candidates_and_an_unknown_one_is_echoed(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "ambiguous", "--command", "true")
    ids = [shared_server.cli_json("run", "start", "ambiguous")["id"] for _ in range(2)]
    shared = _shared_prefix(ids)

    ambiguous = shared_server.cli("run", "show", shared)
    unknown = shared_server.cli("run", "show", "ffffffff-ffff")
    as_json = shared_server.cli("run", "show", shared, "--json")

    assert ambiguous.returncode == 1
    assert ambiguous.stderr.startswith(f"error: ambiguous_id: {shared!r} matches several runs")
    assert all(i in ambiguous.stderr for i in ids) and "give more characters" in ambiguous.stderr
    assert unknown.returncode == 1
    assert "'ffffffff-ffff'" in unknown.stderr and "ql3 run list" in unknown.stderr
    error = json.loads(as_json.stderr)["error"]
    assert as_json.returncode == 1 and as_json.stdout == ""
    assert error["code"] == "ambiguous_id" and set(ids) <= set(error["details"]["candidates"])


def test_approvals_show_task_and_principal_names(shared_server: Server) -> None:
    # Given an approval-required task started by otto and approved by alice, via short ids
    shared_server.cli_json("task", "add", "deploy-named", "--command", "true", "--approval", "required")
    issued = shared_server.cli_json("token", "create", "--role", "approver", "--name", "alice-named")
    otto = shared_server.cli_json("token", "create", "--role", "operator", "--name", "otto-named")
    requested = shared_server.cli_json("run", "start", "deploy-named", env={"QL3_TOKEN": otto["token"]})[
        "approval"
    ]["id"]
    approved = shared_server.cli_json(
        "approval", "approve", requested[:18], env={"QL3_TOKEN": issued["token"]}
    )

    # When people list and show it
    listed = shared_server.cli("approval", "list")
    shown = shared_server.cli("approval", "show", requested[:18])

    # Then the task and both people are named, never their UUIDs
    assert approved["id"] == requested
    row = next(line for line in listed.stdout.splitlines() if line.startswith(requested[:13]))
    assert "run.create deploy-named" in row and requested not in row
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines() if " " in line)
    assert fields["requested_by"].strip() == "otto-named (user)"
    assert fields["decided_by"].strip() == "alice-named (user)"
    assert fields["action"].strip() == "run.create deploy-named"


def test_quiet_lists_print_only_full_ids(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "quiet", "--command", "true")
    ids = [shared_server.cli_json("run", "start", "quiet")["id"] for _ in range(2)]

    runs = shared_server.cli("run", "list", "--task", "quiet", "-q")
    tasks = shared_server.cli("task", "list", "-q")
    workers = shared_server.cli("worker", "list", "-q")
    projects = shared_server.cli("project", "list", "-q")

    assert runs.returncode == 0 and runs.stdout.split() == list(reversed(ids))
    assert runs.stderr == ""
    assert shared_server.cli_json("task", "show", "quiet")["id"] in tasks.stdout.split()
    assert workers.stdout.split() == [w["id"] for w in shared_server.cli_json("worker", "list")["items"]]
    assert projects.stdout.split() == [p["id"] for p in shared_server.cli_json("project", "list")["items"]]


def test_run_start_quiet_wait_prints_the_id_and_exits_with_the_outcome(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "quiet-wait", "--command", "exit 3")

    done = shared_server.cli("run", "start", "quiet-wait", "-q", "--wait")

    # Then stdout is the run's id alone, and the exit status is the run's outcome (failed: 2)
    (run,) = shared_server.cli_json("run", "list", "--task", "quiet-wait")["items"]
    assert done.stdout == f"{run['id']}\n" and done.stderr == ""
    assert run["status"] == "failed" and done.returncode == 2


def test_following_the_next_page_hint_keeps_the_task_and_the_limit(shared_server: Server) -> None:
    # Given three runs of one task and runs of another, newer, task
    shared_server.cli_json("task", "add", "paged-hint", "--command", "true")
    shared_server.cli_json("task", "add", "other-hint", "--command", "true")
    mine = [shared_server.cli_json("run", "start", "paged-hint")["id"] for _ in range(3)]
    for _ in range(3):
        shared_server.cli_json("run", "start", "other-hint")

    # When the first page of two is listed and the printed hint is run as is
    first = shared_server.cli("run", "list", "--task", "paged-hint", "--limit", "2", "-q")
    hint = first.stderr.strip()
    assert hint.startswith("more: ql3 run list "), first.stderr
    words = hint.removeprefix("more: ql3 ").split()
    second = shared_server.cli(*words, "-q")

    # Then it kept --task and --limit: the second page holds the task's remaining run only
    assert "--task paged-hint" in hint and "--limit 2" in hint
    assert first.stdout.split() + second.stdout.split() == list(reversed(mine))


def test_a_missing_task_is_echoed_with_the_closest_name(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "hello-world", "--command", "true")

    done = shared_server.cli("run", "start", "helo-world")
    as_json = shared_server.cli("run", "start", "helo-world", "--json")

    assert done.returncode == 1
    assert done.stderr == (
        "error: not_found: task 'helo-world' not found; did you mean 'hello-world'? (see: ql3 task list)\n"
    )
    assert as_json.returncode == 1 and as_json.stdout == ""
    assert json.loads(as_json.stderr) == {
        "error": {
            "code": "not_found",
            "message": "task 'helo-world' not found; did you mean 'hello-world'? (see: ql3 task list)",
        }
    }


def test_a_task_id_prefix_names_the_task(shared_server: Server) -> None:
    task = shared_server.cli_json("task", "add", "by-prefix", "--command", "true")

    shown = shared_server.cli_json("task", "show", task["id"][:30])

    assert shown["name"] == "by-prefix"
