"""Worker labels end to end: ``ql3 serve --label`` gives the embedded worker labels, ``ql3 worker
list/show`` shows them with slots and busy slots, ``--require``/``--prefer`` runs are placed on it, and a
requirement no registered worker meets is accepted with a warning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import Server, run_cli, start_server, stop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("labels") / "home"
    server = start_server(home, "--label", "gpu=yes", "--label", "zone=eu", "--slots", "3")
    try:
        yield server
    finally:
        stop(server.process)


def test_worker_list_and_show_carry_labels_slots_and_busy(labelled: Server) -> None:
    (worker,) = labelled.cli_json("worker", "list")["items"]
    shown = labelled.cli_json("worker", "show", worker["id"])
    human = labelled.cli("worker", "show", worker["id"])
    listed = labelled.cli("worker", "list")

    assert worker["labels"] == {"gpu": "yes", "zone": "eu"}
    assert (worker["slots"], worker["busy"]) == (3, 0)
    # (a heartbeat may land between the two calls: everything else is the same)
    assert {k: v for k, v in shown.items() if k != "last_heartbeat_at_ms"} == {
        k: v for k, v in worker.items() if k != "last_heartbeat_at_ms"
    }
    assert human.returncode == 0 and "gpu=yes,zone=eu" in human.stdout and "0 busy of 3" in human.stdout
    assert "gpu=yes,zone=eu" in listed.stdout


def test_required_and_preferred_labels_place_runs_on_the_labelled_worker(labelled: Server) -> None:
    added = labelled.cli(
        "task", "add", "trainer", "--command", "true", "--require", "gpu=yes", "--prefer", "zone=eu:5"
    )
    assert added.returncode == 0 and "warning" not in added.stderr

    done = labelled.cli_json("run", "start", "trainer", "--wait", "--timeout-wait", "60")

    assert done["status"] == "succeeded"


def test_a_requirement_no_worker_meets_is_accepted_with_a_warning(labelled: Server) -> None:
    human = labelled.cli("task", "add", "tpu-job", "--command", "true", "--require", "tpu=v5")
    as_json = labelled.cli_json("task", "add", "tpu-job-2", "--command", "true", "--require", "tpu=v5")
    met = labelled.cli_json("task", "add", "gpu-job", "--command", "true", "--require", "gpu=yes")

    assert human.returncode == 0
    assert "warning: no registered worker meets --require tpu=v5" in human.stderr
    assert as_json["name"] == "tpu-job-2"
    warning = "no registered worker meets --require tpu=v5: its runs wait until one does"
    assert as_json["warnings"] == [warning]
    assert met["warnings"] == []


@pytest.mark.parametrize("label", ["novalue", "=v", "k=\x01"])
def test_a_malformed_label_is_a_usage_error(tmp_path: Path, label: str) -> None:
    done = run_cli("serve", "--label", label, home=tmp_path / "home")

    assert done.returncode == 64
    assert not (tmp_path / "home" / "ql3.db").exists()


def test_run_show_says_why_a_queued_run_waits(labelled: Server) -> None:
    labelled.cli_json("task", "add", "needs-tpu", "--command", "true", "--require", "tpu=v4")
    started = labelled.cli_json("run", "start", "needs-tpu")

    human = labelled.cli("run", "show", started["id"])
    as_json = labelled.cli_json("run", "show", started["id"])

    assert human.returncode == 0
    waiting = [line.split(None, 1) for line in human.stdout.splitlines() if line.startswith("waiting")]
    assert waiting == [["waiting", "no matching worker: no worker has the labels the task requires"]]
    assert (as_json["status"], as_json["waiting_reason"]) == ("queued", "no_matching_worker")
