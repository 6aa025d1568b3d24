"""Scripts and subscriptions through the CLI against one real server (docs/scripts.md): put, edit,
history with diffs, run by path with the log streamed, bad input refused with exit 64 and nothing
written; a subscription syncing a local bare git repository into scripts and tasks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from ql3.domain.scripts import MAX_SCRIPT_BYTES
from tests.support.server import Server

pytestmark = pytest.mark.slow


def _api(server: Server) -> httpx.Client:
    token = server.credentials()["token"]
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def _get(server: Server, path: str) -> Any:
    """What the checks read goes through the API (a CLI process per check would double the time)."""
    with _api(server) as api:
        resp = api.get(f"/api/v1/projects/default{path}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_scripts_put_edit_history_run_and_remove(shared_server: Server, tmp_path: Path) -> None:
    server = shared_server
    source = tmp_path / "hello.py"
    source.write_text("import os\nprint('hello v1', os.environ['QL3_SCRIPT_PATH'])\n")

    put = server.cli_json("script", "put", str(source), "demo/hello.py")
    assert (put["path"], put["revision"], put["changed"]) == ("demo/hello.py", 1, True)
    listed = server.cli("script", "list")
    assert listed.stdout.splitlines()[1].split()[:3] == ["demo/hello.py", "1", str(source.stat().st_size)]

    # edit: the user's editor changes the file, saving publishes revision 2 with a diff
    edited = server.cli("script", "edit", "demo/hello.py", env={"EDITOR": "sed -i s/v1/v2/"})
    assert edited.returncode == 0, edited.stderr
    assert _get(server, "/scripts/demo/hello.py")["content"].endswith(
        "print('hello v2', os.environ['QL3_SCRIPT_PATH'])\n"
    )
    diff = server.cli("script", "log", "demo/hello.py", "--revision", "2")
    assert "-print('hello v1'" in diff.stdout and "+print('hello v2'" in diff.stdout
    history = _get(server, "/script-history/demo/hello.py")["items"]
    assert [(r["revision"], r["author"]) for r in history] == [(2, "owner"), (1, "owner")]

    # run by path: a task is made for it and the log streams to stdout
    ran = server.cli("script", "run", "demo/hello.py")
    assert ran.returncode == 0, ran.stderr
    assert "hello v2 demo/hello.py" in ran.stdout
    task = _get(server, "/tasks/demo_hello.py")
    assert task["script"] == "demo/hello.py" and task["command"] == 'python3 "$QL3_SCRIPT"'

    # a removed script: its task's next run fails to start, the history stays
    assert server.cli("script", "rm", "demo/hello.py").returncode == 0
    done = server.cli("run", "start", "demo_hello.py", "--wait", "--json")
    failed = json.loads(done.stdout)
    assert (done.returncode, failed["status"], failed["error_code"]) == (2, "failed", "EXECUTOR_START_FAILED")
    assert len(_get(server, "/script-history/demo/hello.py")["items"]) == 3


def test_bad_script_input_is_refused_and_writes_nothing(shared_server: Server, tmp_path: Path) -> None:
    server = shared_server
    ok = tmp_path / "ok.sh"
    ok.write_text("echo ok\n")
    big = tmp_path / "big.sh"
    big.write_text("#" * (MAX_SCRIPT_BYTES + 1))
    before = _get(server, "/scripts")["items"]

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
    assert _get(server, "/scripts")["items"] == before


def _git(*args: str, cwd: Path) -> None:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": os.environ["PATH"],
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _bare_repository(root: Path) -> str:
    """A QingLong-style repository: a shell script with a ``cron:`` header, a Python one without, a
    symlink pointing out of the checkout (skipped)."""
    work = root / "work"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    (work / "jobs").mkdir()
    (work / "jobs" / "checkin.sh").write_text(
        "#!/bin/sh\n# cron: 15 6 * * *\n# new Env('Check in')\necho checked-in\n"
    )
    (work / "util.py").write_text("print('helper')\n")
    (work / "escape.sh").symlink_to("/etc/passwd")
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "first", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    return f"file://{root / 'repo.git'}"


def test_a_subscription_syncs_a_git_repository_into_scripts_and_tasks(
    shared_server: Server, tmp_path: Path
) -> None:
    server = shared_server
    url = _bare_repository(tmp_path)
    key = tmp_path / "deploy_key"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n")

    # a file:// remote needs no key; this one is kept to show it is never returned
    added = server.cli(
        "subscription",
        "add",
        "qinglong",
        "--repo",
        url,
        "--branch",
        "main",
        "--deploy-key",
        str(key),
        "--sync",
    )
    assert added.returncode == 0, added.stderr
    assert (
        "$ git clone --depth 1" in added.stdout and "created task jobs_checkin.sh (Check in)" in added.stdout
    )
    assert "skipped escape.sh: a symbolic link" in added.stdout

    listed = server.cli("subscription", "list", "--json")
    assert (
        "not-a-real-key" not in listed.stdout
        and json.loads(listed.stdout)["items"][0]["has_credential"] is True
    )
    paths = [s["path"] for s in _get(server, "/scripts")["items"]]
    assert "jobs/checkin.sh" in paths and "util.py" in paths and "escape.sh" not in paths
    task = _get(server, "/tasks/jobs_checkin.sh")
    assert (task["cron"], task["script"], task["command"]) == (
        "15 6 * * *",
        "jobs/checkin.sh",
        'bash "$QL3_SCRIPT"',
    )
    ran = server.cli("run", "start", "jobs_checkin.sh", "--follow")
    assert ran.returncode == 0 and "checked-in" in ran.stdout, ran.stderr

    # the sync was a run of ql3-sync-qinglong: its log is git's output, and the sync's record names it
    last = server.cli("subscription", "log", "qinglong").stdout
    assert "checked out" in last
    run_id = last.split(", run ", 1)[1].split(")", 1)[0]
    sync_run = server.cli_json("run", "show", run_id)
    assert (sync_run["task_name"], sync_run["status"]) == ("ql3-sync-qinglong", "succeeded")
    run_log = server.cli("run", "logs", run_id).stdout
    assert "$ git clone --depth 1" in run_log and "created task jobs_checkin.sh" in run_log
    assert "not-a-real-key" not in run_log + json.dumps(sync_run)
    # an unreachable repository fails (its run too) and changes nothing
    before = _get(server, "/scripts")["items"]
    server.cli_json("subscription", "add", "gone", "--repo", f"file://{tmp_path / 'missing.git'}")
    failed = server.cli("subscription", "sync", "gone")
    assert failed.returncode == 1 and "sync failed" in failed.stderr
    assert "does not appear to be a git repository" in failed.stdout or "fatal" in failed.stdout
    failed_run = server.cli_json("run", "list", "--task", "ql3-sync-gone")["items"]
    assert [r["status"] for r in failed_run] == ["failed"]
    assert _get(server, "/scripts")["items"] == before

    bad = server.cli("subscription", "add", "evil", "--repo", "ext::sh -c id")
    assert bad.returncode != 0 and "invalid repository URL" in bad.stderr
