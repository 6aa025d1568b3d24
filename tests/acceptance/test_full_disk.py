"""A full disk under ``ql3 serve``: a small tmpfs is ``QL3_HOME``, and a task fills it.

While the disk is full: no run is reported ``succeeded`` that did not succeed, the server stays up,
reads keep working, ``/readyz`` says ``disk_full`` (naming the directory), and a new run is either
refused with 503 ``storage_unavailable`` and nothing written (SQLite, whose database is on the full
disk) or accepted (PostgreSQL) and settled like any other. After space returns every run reaches a
terminal state, ``/readyz`` is ready again and new runs succeed with their whole log.

A run whose command fills the disk and then exits 7 while it is still full ends with exit code 7 and
the log written before (its receipt's space was reserved before the spawn); ``ql3 serve`` and
``ql3 worker`` started on the full disk exit 74 with one line naming the directory.

Mounting a tmpfs needs root: the test skips with that reason otherwise, and fails under ``CI=true``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ql3.cli.errors import EXIT_DISK_FULL
from tests.support.server import CLI, Server, base_env, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

DISK_MIB = 48
DEADLINE_S = 90.0
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "lost"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the full-disk test mounts a tmpfs, which needs root: it must run under CI")
        pytest.skip("the full-disk test mounts a small tmpfs, which needs root")
    mount = tmp_path / "disk"
    mount.mkdir(mode=0o700)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs", str(mount)],
        check=True,
        capture_output=True,
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def full_disk_server(request: pytest.FixtureRequest, small_disk: Path) -> Iterator[Server]:
    """SQLite keeps its database on the full disk too; with PostgreSQL only the journal, receipts and
    logs are there (the database keeps taking writes)."""
    extra: tuple[str, ...] = ()
    if request.param == "postgresql":
        database = request.getfixturevalue("pg_database")
        extra = ("--database-url", database.url)
    server = start_server(small_disk / "home", "--slots", "2", *extra)
    try:
        yield server
    finally:
        stop(server.process)


def _api(server: Server) -> httpx.Client:
    token = server.credentials()["token"]
    return httpx.Client(
        base_url=f"{server.url}/api/v1/projects/default",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _worker_lines(server: Server) -> list[str]:
    """The server's own log lines about the worker and storage (what a failure message needs)."""
    return [line[:300] for line in server.log().splitlines() if "worker." in line or "Error" in line][-20:]


def _runs(api: httpx.Client) -> list[dict[str, Any]]:
    resp = api.get("/runs", params={"limit": 100})
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


def test_a_full_disk_gives_no_false_success_and_the_server_recovers(
    full_disk_server: Server, small_disk: Path
) -> None:
    server = full_disk_server
    fill = small_disk / "fill-by-task"
    with _api(server) as api:
        for name, command in (
            ("hello", "echo hello"),
            # dd stops with ENOSPC and exits 1: the disk is full and the command failed.
            ("filler", f"echo filling; dd if=/dev/zero of={fill} bs=64k"),
        ):
            created = api.post("/tasks", json={"name": name, "command": command, "cwd": "/tmp"})
            assert created.status_code == 201, created.text
        first = api.post("/tasks/hello/runs", json={})
        assert first.status_code == 201, first.text
        wait_for(
            lambda: api.get(f"/runs/{first.json()['id']}").json()["status"] in TERMINAL,
            DEADLINE_S,
            what="the first run",
        )

        # A token not used yet: its first use records last_used_at_ms, a write the full disk refuses.
        viewer = api.post("/tokens", json={"role": "viewer", "name": "reader"})
        assert viewer.status_code == 201, viewer.text
        reader = {"Authorization": f"Bearer {viewer.json()['token']}"}

        filler = api.post("/tasks/filler/runs", json={})
        assert filler.status_code == 201, filler.text
        filler_id = filler.json()["id"]
        wait_for(
            lambda: fill.exists() and _free_bytes(small_disk) < 64 * 1024,
            DEADLINE_S,
            what="the task to fill the disk",
        )

        # While the disk is full: the server is up, reads work and /readyz names the problem.
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 503, ready.text
        error = ready.json()["error"]
        assert error["code"] == "disk_full"
        assert any(d["path"].startswith(str(small_disk)) for d in error["details"]["disks"])
        before = _runs(api)
        read = api.get(f"/runs/{filler_id}", headers=reader)
        assert read.status_code == 200, read.text
        refused = api.post("/tasks/hello/runs", json={})
        if refused.status_code != 201:  # a page of the WAL may still be free: then it is a real run
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "storage_unavailable"
            assert len(_runs(api)) == len(before)
        assert next(r for r in _runs(api) if r["id"] == filler_id)["status"] != "succeeded"

        # Space returns: every run settles, none of the filler's is a success, new runs succeed.
        fill.unlink()
        wait_for(
            lambda: httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200,
            DEADLINE_S,
            what="readiness",
        )
        settled = wait_for(
            lambda: (runs := _runs(api)) and all(r["status"] in TERMINAL for r in runs) and runs,
            DEADLINE_S,
            what="every run to reach a terminal state",
        )
        by_id = {r["id"]: r for r in settled}
        assert by_id[first.json()["id"]]["status"] == "succeeded"
        # dd's own exit code (1: stopped by ENOSPC): the receipt's space was reserved before the spawn
        assert by_id[filler_id]["status"] == "failed", by_id[filler_id]
        assert by_id[filler_id]["exit_code"] == 1, by_id[filler_id]
        # Every success is a real one: exit code 0 and the whole log of the command.
        for run in settled:
            if run["status"] == "succeeded":
                assert run["exit_code"] == 0 and run["task_name"] == "hello", run
                assert api.get(f"/runs/{run['id']}/logs/raw").text == "hello\n", run

        again = api.post("/tasks/hello/runs", json={})
        assert again.status_code == 201, again.text
        run_id = again.json()["id"]
        done = wait_for(
            lambda: (r := api.get(f"/runs/{run_id}").json())["status"] in TERMINAL and r,
            DEADLINE_S,
            what="a run after recovery",
        )
        assert done["status"] == "succeeded" and done["exit_code"] == 0, done
        logs = api.get(f"/runs/{run_id}/logs/raw")
        assert logs.status_code == 200 and logs.text == "hello\n", logs.text
    assert server.process.poll() is None
    assert "Traceback" not in server.log(), server.log()[-5000:]


def test_a_run_that_ends_on_a_full_disk_keeps_its_exit_code_and_log(
    full_disk_server: Server, small_disk: Path
) -> None:
    """The command fills the disk, then exits 7 while it is still full: its receipt was reserved
    before the spawn, so the run ends ``failed`` with exit code 7 once space returns, and its log keeps
    the lines written before the disk filled."""
    server = full_disk_server
    fill = small_disk / "fill-then-exit"
    gate = small_disk.parent / "exit-now"
    command = (
        # No pause before dd: the disk may fill before the start's own writes (the journal's `started`,
        # the running ACK) land, which then wait for space like the completion does.
        f"echo before-fill; echo second-line; dd if=/dev/zero of={fill} bs=64k 2>/dev/null; "
        f"i=0; while [ ! -e '{gate}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; exit 7"
    )
    with _api(server) as api:
        created = api.post("/tasks", json={"name": "fill7", "command": command, "cwd": "/tmp"})
        assert created.status_code == 201, created.text
        started = api.post("/tasks/fill7/runs", json={})
        assert started.status_code == 201, started.text
        run_id = started.json()["id"]
        wait_for(
            lambda: fill.exists() and _free_bytes(small_disk) < 64 * 1024,
            DEADLINE_S,
            what="the task to fill the disk",
        )
        gate.touch()  # the command ends (exit 7) while the disk is still full
        time.sleep(3)  # the worker settles (or tries to) while the disk is full
        fill.unlink()
        done = wait_for(
            lambda: (r := api.get(f"/runs/{run_id}").json())["status"] in TERMINAL and r,
            DEADLINE_S,
            what="the run to settle once space returns",
        )
        logs = api.get(f"/runs/{run_id}/logs/raw")
        why = (done.get("error_code"), logs.status_code, logs.text[:200], _worker_lines(server))
        assert done["status"] == "failed" and done["exit_code"] == 7, why
        assert logs.status_code == 200, why
        assert logs.text.startswith("before-fill\nsecond-line\n"), logs.text
    assert server.process.poll() is None
    assert "Traceback" not in server.log(), server.log()[-5000:]


def test_a_start_on_a_full_disk_exits_74_with_one_line(full_disk_server: Server, small_disk: Path) -> None:
    """``ql3 serve`` restarted on its full disk (SQLite: the database is there too; PostgreSQL: the
    journal, receipts and logs are) and ``ql3 worker`` started there exit 74 with one line naming the
    full directory: no traceback, nothing started."""
    server = full_disk_server
    argv = [str(arg) for arg in server.process.args]  # type: ignore[union-attr]
    assert stop(server.process) == 0
    fill = small_disk / "fill-before-start"
    subprocess.run(["dd", "if=/dev/zero", f"of={fill}", "bs=64k"], capture_output=True, check=False)
    assert _free_bytes(small_disk) < 64 * 1024

    token = small_disk.parent / "worker.token"
    token.write_text("x" * 43)
    token.chmod(0o600)
    for command, named in (
        (argv, server.home),
        (
            [
                *CLI,
                "worker",
                "--server",
                server.url,
                "--token-file",
                str(token),
                "--home",
                str(small_disk / "w"),
            ],
            small_disk / "w",
        ),
    ):
        done = subprocess.run(
            command, env=base_env(server.home), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == EXIT_DISK_FULL, (command, done.returncode, done.stderr[-3000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: disk_full: "), done.stderr
        assert str(named) in lines[0], lines[0]
        assert "Traceback" not in done.stderr + done.stdout

    # Space returns: the same start works again.
    fill.unlink()
    again = start_server(server.home, *argv[argv.index("--slots") :])
    try:
        assert httpx.get(f"{again.url}/readyz", timeout=10).status_code == 200
    finally:
        assert stop(again.process) == 0
