"""``ql3 run cancel | status | blocked | inspect | rearm`` in-process against the app: exit codes,
one projection for the card and the JSON, and local usage checks that send no request."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from ql3.application import cancellation, cancellation_supervisor
from ql3.domain.offers import LeaseFence
from tests.support.cancellation_builders import FakeSignal, running_runs

Cli = Callable[..., tuple[int, str, str]]


def _blocked(db: Any, n: int = 1) -> list[LeaseFence]:
    project, fences = running_runs(db, n, name="blocked-job")
    for fence in fences:
        db.transaction(
            lambda tx, f=fence: cancellation.request_cancel(
                tx, project.id, f.run_id, reason="user", actor_type="user", actor_id="u"
            )
        )
    cancellation_supervisor.CancellationSupervisor(
        db, signal=FakeSignal(default="identity_mismatch"), owner="sup", page=64
    ).run_cycle()
    return fences


def _leased(db: Any) -> str:
    """A cancellation claimed by a supervisor that has not reported yet: converging."""
    project, fences = running_runs(db, 1, name="leased-job")
    run_id = fences[0].run_id
    db.transaction(
        lambda tx: cancellation.request_cancel(tx, project.id, run_id, reason="user", actor_type="user")
    )
    claimed = db.transaction(
        lambda tx: cancellation.claim(tx, run_id=run_id, owner="sup", token="t" * 40, lease_ms=30_000)
    )
    assert claimed.status == "claimed"
    return run_id


def _card(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(" ") for line in text.splitlines())}


def _flat(value: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out.update(_flat(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(item)
    return out


def _status(cli_main: Cli) -> tuple[int, dict[str, Any], int, dict[str, str]]:
    code_json, out_json, _ = cli_main("run", "status", "--json")
    code_card, out_card, _ = cli_main("run", "status")
    return code_json, json.loads(out_json), code_card, _card(out_card)


def test_run_status_exit_codes_follow_the_assessment(db: Any, cli_main: Cli) -> None:
    # Clear: exit 0
    code, status, card_code, card = _status(cli_main)
    assert (code, card_code) == (0, 0)
    assert status["schema"] == "qinglong/run-cancellation-status@v1"
    assert status["assessment"] == "clear"

    # Converging (a leased cancellation): exit 10
    _leased(db)
    code, status, card_code, card = _status(cli_main)
    assert (code, card_code) == (10, 10)
    assert status["assessment"] == "converging" and status["dispatches"]["leased"] == 1
    assert card["assessment"] == "converging"

    # Attention required (a blocked cancellation): exit 20, and the card is the JSON, field by field
    _blocked(db)
    code, status, card_code, card = _status(cli_main)
    assert (code, card_code) == (20, 20)
    assert status["assessment"] == "attention_required"
    flat = _flat(status)
    # instants are shown as labelled times, under their names without "Ms"
    assert list(card) == [k.removesuffix("Ms") if k.endswith("AtMs") else k for k in flat]
    instants = [k for k in flat if k.endswith("AtMs")]
    assert "observedAtMs" in instants and "oldestBlockedAtMs" in instants
    for key in instants:
        shown = card.pop(key.removesuffix("Ms"))
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+|-", shown), shown
        flat.pop(key)
    assert card == flat
    assert card["dispatches.blocked"] == "1"


def test_run_status_makes_exactly_one_request(cli_main: Cli) -> None:
    cli_main.requests.clear()  # type: ignore[attr-defined]
    code, _, _ = cli_main("run", "status")
    assert code == 0
    assert cli_main.requests == ["/api/v1/projects/default/cancellation/summary"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("cursor", ["nope", "v1.", "v1.eyJ4IjoxfQ", "v1." + "A" * 300])
def test_run_blocked_rejects_a_malformed_cursor_before_any_request(cli_main: Cli, cursor: str) -> None:
    cli_main.requests.clear()  # type: ignore[attr-defined]
    code, out, err = cli_main("run", "blocked", "--cursor", cursor)
    assert code == 64
    assert "invalid_cursor" in err and out == ""
    assert cli_main.requests == []  # type: ignore[attr-defined]


def test_run_blocked_prints_one_page_of_16_and_the_next_cursor(db: Any, cli_main: Cli) -> None:
    fences = _blocked(db, 17)

    code, out, _ = cli_main("run", "blocked")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "BLOCKED"]
    assert len(lines) == 1 + 16 + 1
    assert lines[-1].startswith("next cursor: ")
    cursor = lines[-1].removeprefix("next cursor: ")

    code, out, _ = cli_main("run", "blocked", "--cursor", cursor, "--json")
    assert code == 0
    page = json.loads(out)
    assert len(page["items"]) == 1 and page["truncated"] is False and page["nextCursor"] is None
    first = [line.split()[0] for line in lines[1:17]]
    assert sorted([*first, page["items"][0]["runId"]]) == sorted(f.run_id for f in fences)


def test_run_cancel_wait_exit_codes(db: Any, client: Any, owner: Any, make_task: Any, cli_main: Cli) -> None:
    # A queued run: cancelled at once, exit 0; again: already_terminal, exit 0
    make_task("job")
    run = client.post("/api/v1/projects/default/tasks/job/runs", json={}, headers=owner).json()
    code, out, _ = cli_main("run", "cancel", run["id"], "--wait", "--json")
    assert code == 0
    assert json.loads(out)["run"]["status"] == "cancelled"
    code, out, _ = cli_main("run", "cancel", run["id"], "--wait")
    assert code == 0 and "already_terminal" in out

    # A running run whose cancellation is blocked: --wait stops with 20, pointing at inspect
    run_id = _blocked(db)[0].run_id
    code, _, err = cli_main("run", "cancel", run_id, "--wait")
    assert code == 20
    assert "cancellation_blocked" in err and f"ql3 run inspect {run_id}" in err

    # A viewer cannot cancel: exit 1
    viewer = _viewer(db)
    code, _, err = cli_main("run", "cancel", run["id"], headers=viewer)
    assert code == 1 and "permission_denied" in err


def _viewer(db: Any) -> dict[str, str]:
    from ql3.application import auth

    token = db.transaction(
        lambda tx: auth.issue_token(tx, name="v", role="viewer", project=auth.resolve_project(tx, "default"))
    ).token
    return {"Authorization": f"Bearer {token}"}


def test_inspect_then_rearm_with_the_printed_version(db: Any, cli_main: Cli) -> None:
    run_id = _blocked(db)[0].run_id
    code, out, err = cli_main("run", "inspect", run_id)
    assert code == 0
    assert "operatorAction" in out and "rearm" in out
    assert "ql3 run rearm" in err
    code, out, _ = cli_main("run", "inspect", run_id, "--json")
    view = json.loads(out)
    version, result = view["dispatch"]["version"], view["dispatch"]["lastResult"]

    # Usage errors are caught locally and send nothing
    cli_main.requests.clear()  # type: ignore[attr-defined]
    for bad in (
        ["--version", str(version), "--result", result, "--delay", "0.5"],
        ["--version", str(version), "--result", "dispatch_error", "--delay", "60"],
        ["--version", "0", "--result", result, "--delay", "60"],
    ):
        assert cli_main("run", "rearm", run_id, *bad)[0] == 64, bad
    assert cli_main.requests == []  # type: ignore[attr-defined]

    # A stale version is refused by the server (exit 1); the exact one rearms
    stale = cli_main(
        "run", "rearm", run_id, "--version", str(version + 1), "--result", result, "--delay", "60"
    )
    assert stale[0] == 1 and "fence_conflict" in stale[2]
    code, out, _ = cli_main(
        "run", "rearm", run_id, "--version", str(version), "--result", result, "--delay", "60", "--json"
    )
    assert code == 0
    receipt = json.loads(out)
    assert receipt["status"] == "rearmed" and receipt["retryDelayMs"] == 60_000
    assert receipt["dispatchVersion"] == version + 1
