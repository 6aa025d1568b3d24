"""``ql3 run start`` of an approval-required task, ``ql3 approval`` and ``ql3 action`` in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.support import approval_builders

Cli = Callable[..., tuple[int, str, str]]


def _n_runs(db: Any) -> int:
    return int(db.raw("SELECT count(*) AS n FROM runs")[0]["n"])


def test_run_start_of_an_approval_required_task_prints_the_approval_and_exits_0(
    db: Any, make_task: Callable[..., dict[str, Any]], cli_main: Cli
) -> None:
    make_task("gated", approval="required")

    code, out, err = cli_main("run", "start", "gated")
    assert code == 0, err
    assert out.startswith("approval ") and "requested" in out
    approval_id = out.split()[1]

    code, out, _ = cli_main("run", "start", "gated", "--wait", "--json")
    assert code == 0
    body = json.loads(out)
    assert set(body) == {"approval"}
    assert body["approval"]["state"] == "pending" and body["approval"]["id"] != approval_id
    assert _n_runs(db) == 0

    code, out, _ = cli_main("approval", "list", "--state", "pending", "--json")
    assert code == 0
    assert {a["id"] for a in json.loads(out)["items"]} == {approval_id, body["approval"]["id"]}
    code, out, _ = cli_main("approval", "show", approval_id)
    assert code == 0 and "pending" in out


def test_approval_decisions_through_the_cli(
    make_task: Callable[..., dict[str, Any]], make_token: Callable[..., dict[str, str]], cli_main: Cli
) -> None:
    make_task("gated", approval="required")
    approval_id = cli_main("run", "start", "gated")[1].split()[1]
    approver = make_token("approver", name="ap")

    # The requester cannot approve their own request: exit 1
    code, _, err = cli_main("approval", "approve", approval_id)
    assert code == 1 and "separation_of_duty" in err
    # A malformed reason and a reject without one are usage errors (64), sent nowhere
    cli_main.requests.clear()  # type: ignore[attr-defined]
    assert cli_main("approval", "approve", approval_id, "--reason", "Not A Code", headers=approver)[0] == 64
    assert cli_main("approval", "reject", approval_id, headers=approver)[0] == 64
    assert cli_main.requests == []  # type: ignore[attr-defined]

    code, out, _ = cli_main("approval", "approve", approval_id, headers=approver)
    assert code == 0 and out.strip() == f"approval {approval_id} approved"
    code, _, err = cli_main("approval", "reject", approval_id, "--reason", "too_late", headers=approver)
    assert code == 1 and "conflict" in err


def test_a_reject_note_through_the_cli_is_shown_by_approval_show(
    make_task: Callable[..., dict[str, Any]], make_token: Callable[..., dict[str, str]], cli_main: Cli
) -> None:
    make_task("gated", approval="required")
    approval_id = cli_main("run", "start", "gated")[1].split()[1]
    approver = make_token("approver", name="ap")

    # A note with a control character or over 500 characters is a usage error, sent nowhere
    cli_main.requests.clear()  # type: ignore[attr-defined]
    for bad in ("two\nlines", "n" * 501):
        args = ("approval", "reject", approval_id, "--reason", "bad_timing", "--note", bad)
        assert cli_main(*args, headers=approver)[0] == 64
    assert cli_main.requests == []  # type: ignore[attr-defined]

    args = ("approval", "reject", approval_id, "--reason", "bad_timing", "--note", "after the freeze")
    code, _, err = cli_main(*args, headers=approver)
    assert code == 0, err
    code, out, _ = cli_main("approval", "show", approval_id)
    assert code == 0
    lines = {
        line.split(None, 1)[0]: line.split(None, 1)[1] for line in out.splitlines() if " " in line.strip()
    }
    assert lines["note"].strip() == "after the freeze"
    assert lines["task_revision"].strip() == "1"
    assert lines["reason"].strip() == "bad_timing"


def test_action_commands(cli_main: Cli) -> None:
    code, out, _ = cli_main("action", "list", "--json")
    assert code == 0 and json.loads(out) == {"items": [], "next_cursor": None}
    cli_main.requests.clear()  # type: ignore[attr-defined]
    assert cli_main("action", "resolve", "x", "--outcome", "retry", "--version", "1")[0] == 64
    assert (
        cli_main("action", "resolve", "x", "--outcome", "failed", "--version", "1", "--reason", "Bad")[0]
        == 64
    )
    assert cli_main.requests == []  # type: ignore[attr-defined]
    code, _, err = cli_main(
        "action", "resolve", "01a00000-0000-7000-8000-0000000000aa", "--outcome", "failed", "--version", "1"
    )
    assert code == 1 and "not_found" in err


def test_a_blocked_action_says_it_is_final_and_what_to_do_next(db: Any, cli_main: Cli) -> None:
    # Given an approved run.create action whose handler's outcome was indeterminate: blocked, terminal
    w = approval_builders.world(db, task_name="deploy")
    dispatch = approval_builders.dispatched(w)
    fence = approval_builders.started(db, dispatch)
    approval_builders.complete(db, fence, outcome="indeterminate", result_code="handler_unknown")

    # When a person shows it
    code, out, err = cli_main("action", "show", dispatch.id, "-p", w.project.name)

    # Then it says that it is final, and how to do it after all
    assert code == 0, err
    fields = {line.split(None, 1)[0]: line.split(None, 1)[1].strip() for line in out.splitlines()}
    assert fields["effective_status"] == "blocked"
    assert fields["terminal"].startswith("yes: a blocked action is final, it is never retried")
    assert fields["next_step"] == (
        "to run it after all, request a new approval: ql3 run start deploy, then an approver decides"
    )
    # And the list says so too, once, beside the table
    code, out, err = cli_main("action", "list", "-p", w.project.name)
    assert code == 0 and "1 blocked: final, never retried" in err


def test_an_action_that_is_not_blocked_shows_no_next_step(db: Any, cli_main: Cli) -> None:
    w = approval_builders.world(db, task_name="deploy")
    dispatch = approval_builders.dispatched(w)

    code, out, _ = cli_main("action", "show", dispatch.id, "-p", w.project.name)

    assert code == 0 and "next_step" not in out and "terminal" not in out
