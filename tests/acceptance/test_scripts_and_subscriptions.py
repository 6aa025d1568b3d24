"""Scripts and subscriptions through the CLI against one real server (docs/scripts.md): put, edit,
history with diffs, run by path with the log streamed, bad input refused with exit 64 and nothing
written; a subscription syncing a local bare git repository into scripts and tasks."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ql3.domain.scripts import MAX_SCRIPT_BYTES
from tests.support.server import Server

pytestmark = pytest.mark.slow


def _api(server: Server) -> httpx.Client:
    token = server.credentials()["token"]
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_scripts_put_edit_history_run_and_remove(shared_server: Server, tmp_path: Path) -> None:
    server = shared_server
    source = tmp_path / "hello.py"
    source.write_text("import os\nprint('hello v1', os.environ['QL3_SCRIPT_PATH'])\n")

    put = server.cli_json("script", "put", str(source), "demo/hello.py")
    assert (put["path"], put["revision"], put["changed"]) == ("demo/hello.py", 1, True)
    assert server.cli_json("script", "put", str(source), "demo/hello.py")["changed"] is False
    listed = server.cli_json("script", "list")
    assert [s["path"] for s in listed["items"]] == ["demo/hello.py"]

    # edit: the user's editor changes the file, saving publishes revision 2 with a diff
    edited = server.cli("script", "edit", "demo/hello.py", env={"EDITOR": "sed -i s/v1/v2/"})
    assert edited.returncode == 0, edited.stderr
    assert server.cli("script", "show", "demo/hello.py").stdout.endswith(
        "print('hello v2', os.environ['QL3_SCRIPT_PATH'])\n"
    )
    diff = server.cli("script", "log", "demo/hello.py", "--revision", "2")
    assert "-print('hello v1'" in diff.stdout and "+print('hello v2'" in diff.stdout
    history = server.cli_json("script", "log", "demo/hello.py")["items"]
    assert [(r["revision"], r["author"]) for r in history] == [(2, "owner"), (1, "owner")]

    # run by path: a task is made for it and the log streams to stdout
    ran = server.cli("script", "run", "demo/hello.py")
    assert ran.returncode == 0, ran.stderr
    assert "hello v2 demo/hello.py" in ran.stdout
    task = server.cli_json("task", "show", "demo_hello.py")
    assert task["script"] == "demo/hello.py" and task["command"] == 'python3 "$QL3_SCRIPT"'

    # a removed script: its task's next run fails to start, the history stays
    assert server.cli("script", "rm", "demo/hello.py").returncode == 0
    done = server.cli("run", "start", "demo_hello.py", "--wait", "--json")
    failed = json.loads(done.stdout)
    assert (done.returncode, failed["status"], failed["error_code"]) == (2, "failed", "EXECUTOR_START_FAILED")
    assert len(server.cli_json("script", "log", "demo/hello.py")["items"]) == 3


def test_bad_script_input_is_refused_and_writes_nothing(shared_server: Server, tmp_path: Path) -> None:
    server = shared_server
    ok = tmp_path / "ok.sh"
    ok.write_text("echo ok\n")
    big = tmp_path / "big.sh"
    big.write_text("#" * (MAX_SCRIPT_BYTES + 1))
    before = server.cli_json("script", "list")["items"]

    traversal = server.cli("script", "put", str(ok), "../../etc/cron.d/x")
    oversized = server.cli("script", "put", str(big), "big.sh")
    assert (traversal.returncode, oversized.returncode) == (64, 64)
    assert "invalid path" in traversal.stderr and "size limit" in oversized.stderr

    with _api(server) as api:  # the API says the same to a client that skips the CLI's checks
        escaped = api.put("/api/v1/projects/default/scripts/a%2F..%2F..%2Fx.sh", json={"content": "x"})
        too_big = api.put(
            "/api/v1/projects/default/scripts/big.sh", json={"content": "x" * (MAX_SCRIPT_BYTES + 1)}
        )
    assert (escaped.status_code, escaped.json()["error"]["code"]) == (422, "validation_failed")
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (422, "validation_failed")
    assert server.cli_json("script", "list")["items"] == before
