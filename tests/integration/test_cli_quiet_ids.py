"""``-q`` wherever a command prints an id: the full id alone on stdout (``id=$(ql3 run start job -q)``),
the same id ``--json`` gives; listings print one id a line. And ``QL3_URL`` with several replicas."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from ql3.domain.ids import is_id

CliMain = Callable[..., tuple[int, str, str]]


def _quiet(cli_main: CliMain, *args: str) -> str:
    code, out, err = cli_main(*args, "-q")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 and is_id(lines[0]), out
    return lines[0]


def _quiet_list(cli_main: CliMain, *args: str) -> list[str]:
    code, out, err = cli_main(*args, "-q")
    assert code == 0, err
    lines = out.splitlines()
    assert all(is_id(line) for line in lines), out
    return lines


def _json(cli_main: CliMain, *args: str) -> Any:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_commands_that_create_or_act_on_one_thing_print_its_id_alone(
    cli_main: CliMain, register_worker: Callable[..., None]
) -> None:
    task_id = _quiet(cli_main, "task", "add", "quiet-job", "--command", "true")
    assert _json(cli_main, "task", "show", "quiet-job")["id"] == task_id

    run_id = _quiet(cli_main, "run", "start", "quiet-job")
    assert _json(cli_main, "run", "show", run_id)["task_id"] == task_id
    assert _quiet(cli_main, "run", "cancel", run_id[:13]) == run_id  # the full id for a prefix

    project_id = _quiet(cli_main, "project", "create", "quiet-project")
    assert project_id in _quiet_list(cli_main, "project", "list")

    register_worker("quiet-w1")  # worker ids are names, not UUIDs
    assert cli_main("worker", "drain", "quiet-w1", "-q")[:2] == (0, "quiet-w1\n")


def test_an_approval_required_run_start_prints_the_request_id(cli_main: CliMain) -> None:
    _quiet(cli_main, "task", "add", "quiet-gated", "--command", "true", "--approval", "required")

    approval_id = _quiet(cli_main, "run", "start", "quiet-gated")

    assert approval_id in _quiet_list(cli_main, "approval", "list")


def test_listings_of_tokens_and_rules_print_one_id_a_line(cli_main: CliMain) -> None:
    tokens = _json(cli_main, "token", "list")["items"]
    assert _quiet_list(cli_main, "token", "list") == [t["id"] for t in tokens]

    code, _, err = cli_main("notify", "channel", "add", "hook", "--webhook", "https://hooks.example.com/ql3")
    assert code == 0, err
    rule_id = _quiet(cli_main, "notify", "rule", "add", "--channel", "hook")
    assert _quiet_list(cli_main, "notify", "rule", "list") == [rule_id]


def test_quiet_and_follow_are_refused_together(cli_main: CliMain) -> None:
    _quiet(cli_main, "task", "add", "quiet-follow", "--command", "true")

    code, out, err = cli_main("run", "start", "quiet-follow", "-q", "--follow")

    assert code == 64 and out == "" and re.search(r"-q .*--follow", err)
    assert _json(cli_main, "run", "list", "--task", "quiet-follow")["items"] == []  # nothing was started


def test_ql3_url_takes_several_replicas_and_refuses_a_bad_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from ql3.cli.config import resolve_credentials
    from ql3.cli.errors import CliError

    monkeypatch.setenv("QL3_TOKEN", "t")
    monkeypatch.setenv("QL3_URL", " http://cp-a:5700/ , https://cp-b:5700")
    assert resolve_credentials().url == "http://cp-a:5700,https://cp-b:5700"

    monkeypatch.setenv("QL3_URL", "http://cp-a:5700,cp-b:5700")
    with pytest.raises(CliError) as caught:
        resolve_credentials()
    assert caught.value.code == "bad_credentials" and "comma-separated" in caught.value.message
