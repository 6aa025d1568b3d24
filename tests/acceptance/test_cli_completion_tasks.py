"""``ql3 completion``: TAB after a command that takes a TASK offers the project's task names that
start with what is typed, asked from the running server (bounded pages, a short timeout), and
nothing at all when the server cannot be reached."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from ql3.cli import completion
from tests.support.server import CLI, base_env, start_server, stop

pytestmark = pytest.mark.slow


def _complete(home: Path, line: str, tmp_path: Path, env: dict[str, str] | None = None) -> set[str]:
    answer = tmp_path / "answer"
    answer.unlink(missing_ok=True)
    done = subprocess.run(
        CLI,
        env={
            **base_env(home),
            **(env or {}),
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_SHELL": "bash",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
            "_ARGCOMPLETE_IFS": "\n",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(answer.read_text().split())


def test_task_arguments_complete_the_names_the_server_has(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_server(home)
    try:
        for name in ("backup-db", "backup-logs", "report", "bac"):
            server.cli_json("task", "add", name, "--command", "true")
        server.cli_json("project", "create", "other")
        server.cli_json("task", "add", "backup-other", "--command", "true", "--project", "other")

        # Names with the typed prefix, for every command that takes a TASK
        assert _complete(home, "ql3 task show back", tmp_path) == {"backup-db", "backup-logs"}
        assert _complete(home, "ql3 run start backup-l", tmp_path) == {"backup-logs"}
        assert _complete(home, "ql3 task show ", tmp_path) == {"bac", "backup-db", "backup-logs", "report"}
        # in the project already typed
        assert _complete(home, "ql3 task show --project other back", tmp_path) == {"backup-other"}
        # no name matches: nothing
        assert _complete(home, "ql3 task show zz", tmp_path) == set()
    finally:
        stop(server.process)

    # A server that is gone completes nothing, and quickly
    assert _complete(home, "ql3 task show back", tmp_path) == set()


def test_the_completer_reads_bounded_pages_and_stops_past_the_prefix() -> None:
    names = [*sorted(f"job-{i:04d}" for i in range(1000)), "zzz"]
    asked: list[dict[str, Any]] = []

    def get(path: str, params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        after = params.get("cursor", "")
        page = [n for n in names if n > after][: params["limit"]]
        more = len(page) == params["limit"]
        return {"items": [{"name": n} for n in page], "next_cursor": page[-1] if more else None}

    # A prefix whose names end inside the first page: one request, starting just below the prefix
    assert completion.task_names("job-000", "default", get) == [f"job-{i:04d}" for i in range(10)]
    assert len(asked) == 1 and asked[0]["cursor"] == "job-00/"

    # Every name matching: at most MAX_COMPLETION_PAGES pages are read
    asked.clear()
    found = completion.task_names("job-", "default", get)
    assert len(asked) == completion.MAX_COMPLETION_PAGES
    assert found == names[: completion.MAX_COMPLETION_PAGES * completion.COMPLETION_PAGE]
