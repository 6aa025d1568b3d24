"""``ql3 worker --run-as USER``, a real remote worker on a real control plane (docs/security.md "A
remote worker"): an operator's task runs as the task user and can neither read the worker's token
file, home, journal, receipts or other runs' logs, nor signal the worker, nor find the callback token
or the worker credential in its environment; another project's run waits unclaimed for labels the
worker was never approved for. Without ``--run-as`` the worker warns; bad run-as flags exit 64."""

from __future__ import annotations

import contextlib
import http.server
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, add_task, wait_terminal
from tests.support.databases import PgDatabase
from tests.support.server import CLI, base_env, stop

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
TASK_USER = "ql3-task-test"
BETA = "/api/v1/projects/beta"


@pytest.fixture(scope="module")
def task_user() -> str:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the --run-as tests need root under CI")
        pytest.skip("the --run-as tests need root")
    try:
        pwd.getpwnam(TASK_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TASK_USER],
            check=True,
            capture_output=True,
        )
    return TASK_USER


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A world-traversable parent, so that only the worker's own file modes protect its state."""
    base = Path(tempfile.mkdtemp(prefix="ql3-remote-runas-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _refusing_server() -> Iterator[str]:
    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"error":{"code":"unauthenticated","message":"no"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _log(cluster: Cluster, run_id: str, marker: str) -> str:
    """The run's log as the server stored it (shipped by the worker), once ``marker`` arrived."""
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        done = cluster.cli("run", "logs", run_id)
        text = done.stdout
        if marker in text:
            return text
        time.sleep(0.2)
    pytest.fail(f"the log never showed {marker}:\n{text}\n{cluster.logs()}")


def test_a_task_on_a_remote_worker_run_as_a_task_user_reaches_nothing_of_the_worker(
    task_user: str, open_base: Path, pg_database: PgDatabase
) -> None:
    cluster = Cluster(base=open_base, db_url=pg_database.url)
    try:
        cluster.start_replica("cp-a")
        with cluster.api() as api:
            # Given project beta's run, waiting for a worker labelled zone=b
            assert api.post("/api/v1/projects", json={"name": "beta"}).status_code == 201
            made = api.post(
                f"{BETA}/tasks",
                json={"name": "beta-job", "command": "echo beta-secret", "require": {"zone": "b"}},
            )
            assert made.status_code == 201, made.text
            beta_run = api.post(f"{BETA}/tasks/beta-job/runs", json={})
            assert beta_run.status_code == 201, beta_run.text
            # and a remote worker labelled zone=a whose tasks run as the task user, with a run done
            worker = cluster.start_worker("w1", 0, "--run-as", task_user, "--label", "zone=a")
            add_task(api, "first", "echo other-runs-secret-output", cwd="/tmp")
            first = api.post("/api/v1/projects/default/tasks/first/runs", json={}).json()["id"]
            assert wait_terminal(api, [first])[first] == "succeeded", cluster.logs()
            state = worker.home / "state"
            targets = [
                worker.token_file,
                *sorted(p for p in state.rglob("*") if p.is_file()),
            ]
            assert any(p.suffix == ".log" for p in targets) and any(p.name == "journal.db" for p in targets)
            listed = [worker.home, state, state / "receipts", state / "logs"]
            assert all(d.is_dir() for d in listed)
            probe = "; ".join(
                f"if cat '{t}' >/dev/null 2>&1; then echo 'READ {t}'; else echo 'DENIED {t}'; fi"
                for t in targets
            )
            probe += "".join(
                f"; ls '{d}' >/dev/null 2>&1 && echo 'LISTED {d}' || echo 'DENIED listing {d}'"
                for d in listed
            )
            probe += f"; kill -0 {worker.process.pid} 2>/dev/null && echo 'SIGNALLED' || echo 'DENIED signal'"
            probe += f"; cat /proc/{worker.process.pid}/environ >/dev/null 2>&1 && echo 'READ environ'"
            probe += "; echo uid=$(id -u); env; echo END-OF-PROBE"

            # When an operator's task probes them
            add_task(api, "probe", probe, cwd="/tmp")
            run_id = api.post("/api/v1/projects/default/tasks/probe/runs", json={}).json()["id"]
            status = wait_terminal(api, [run_id])[run_id]
            log = _log(cluster, run_id, "END-OF-PROBE")
            beta = api.get(f"{BETA}/runs/{beta_run.json()['id']}").json()
        token = worker.token_file.read_text().strip()
        worker_log = worker.log()
    finally:
        cluster.stop_all()

    # Then it ran as the task user and reached nothing
    assert status == "succeeded", log
    assert f"uid={pwd.getpwnam(task_user).pw_uid}" in log
    assert "READ " not in log and "LISTED" not in log and "SIGNALLED" not in log, log
    assert log.count("DENIED ") == len(targets) + len(listed) + 1
    assert "other-runs-secret-output" not in log
    # And its environment holds neither the worker credential nor the callback token, nor the home
    environment = [line for line in log.splitlines() if "=" in line and not line.startswith("uid=")]
    assert environment, log
    assert token not in log
    assert not [line for line in environment if "CALLBACK_TOKEN" in line or str(worker.home) in line]
    assert f"HOME={pwd.getpwnam(task_user).pw_dir}" in environment
    # And beta's run still waits: this worker never registered beta's labels
    assert beta["status"] == "queued", beta
    assert "warning: tasks run as this worker's own user" not in worker_log


def test_a_worker_without_run_as_warns_and_bad_run_as_flags_exit_64(
    task_user: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ql3.cli import main as cli

    token = tmp_path / "w.token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"ql3_" + b"a" * 43 + b"\n")
    os.close(fd)
    home = tmp_path / "home"
    base = ["worker", "--server", "http://127.0.0.1:1", "--token-file", str(token)]
    open_home = tmp_path / "open"
    open_home.mkdir(mode=0o755)
    os.chmod(open_home, 0o755)
    theirs = tmp_path / "theirs.token"  # mode 0600, but the task user's own file to read
    shutil.copy(token, theirs)
    os.chown(theirs, pwd.getpwnam(task_user).pw_uid, -1)
    cases = [
        (["--token-file", str(theirs)], "owned by uid"),
        (["--run-as", "no-such-user-ql3"], "no such user"),
        (["--run-as", pwd.getpwuid(os.geteuid()).pw_name], "own user"),
        (["--project-run-as", f"default={task_user}"], "not a project id"),
        (["--run-as", task_user, "--home", str(open_home)], "chmod 700"),
    ]
    monkeypatch.setenv("QL3_HOME", str(home))
    # in process: each refusal comes before anything starts (a server that refuses every credential
    # ends a worker that got past its checks at once, instead of retrying an unreachable one)
    with _refusing_server() as refusing:
        for flags, message in cases:
            code = cli.main([*base, "--server", refusing, *flags])
            err = capsys.readouterr().err
            assert code == 64, (flags, err)
            assert message in err, (flags, err)
    assert not home.exists()

    # And a worker without --run-as says what its tasks can reach before it tries the server
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*CLI, *base], env=base_env(home), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + 20
        while "unreachable" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        stop(process)
    text = log_path.read_text()
    assert "warning: tasks run as this worker's own user" in text and "--run-as USER" in text, text


def test_a_script_task_on_a_remote_worker_runs_as_the_task_user_from_a_file_it_cannot_change(
    task_user: str, open_base: Path, pg_database: PgDatabase
) -> None:
    cluster = Cluster(base=open_base, db_url=pg_database.url)
    script = (
        "echo uid=$(id -u)\n"
        'echo x >> "$QL3_SCRIPT" 2>/dev/null && echo WROTE-SCRIPT || echo DENIED write\n'
        'touch "$(dirname "$QL3_SCRIPT")/other" 2>/dev/null && echo WROTE-DIR || echo DENIED dir\n'
        'echo "at $QL3_SCRIPT"; echo END-OF-PROBE\n'
    )
    try:
        cluster.start_replica("cp-a")
        with cluster.api() as api:
            # Given a script shipped in the offer to a remote worker whose tasks run as the task user
            worker = cluster.start_worker("w1", 0, "--run-as", task_user)
            put = api.put("/api/v1/projects/default/scripts/jobs/probe.sh", json={"content": script})
            assert put.status_code == 201, put.text
            made = api.post(
                "/api/v1/projects/default/tasks",
                json={"name": "probe", "script": "jobs/probe.sh", "cwd": "/tmp"},
            )
            assert made.status_code == 201, made.text

            # When it runs
            run_id = api.post("/api/v1/projects/default/tasks/probe/runs", json={}).json()["id"]
            status = wait_terminal(api, [run_id])[run_id]
            log = _log(cluster, run_id, "END-OF-PROBE")
    finally:
        cluster.stop_all()

    # Then it ran as the task user, outside the worker's home, and could change neither file nor folder
    assert status == "succeeded", log
    assert f"uid={pwd.getpwnam(task_user).pw_uid}" in log
    assert "WROTE" not in log and log.count("DENIED ") == 2, log
    at = next(line for line in log.splitlines() if line.startswith("at "))[3:]
    assert at.endswith("/probe.sh") and not at.startswith(str(worker.home)), at
    assert Path(at).read_text() == script
    shutil.rmtree(Path(at).parents[2], ignore_errors=True)  # the host's temporary directory
