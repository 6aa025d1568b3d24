"""Real processes for the cluster acceptance tests: ``ql3 control`` replicas on one PostgreSQL
database and remote ``ql3 worker`` processes attached to them over HTTP (docs/cluster.md)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.server import CLI, START_TIMEOUT_S, base_env, free_port, run_cli, start_listener, stop

P = "/api/v1/projects/default"
SETTLE_S = 50.0


@dataclass
class Replica:
    home: Path
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Worker:
    worker_id: str
    home: Path
    token_file: Path
    server: str
    process: subprocess.Popen[bytes]
    log_path: Path
    extra: tuple[str, ...] = ()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Cluster:
    base: Path
    db_url: str
    replicas: list[Replica] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    verify: ssl.SSLContext | bool = True  # trusts the replicas' CA when they serve HTTPS

    @property
    def owner_home(self) -> Path:
        return self.replicas[0].home  # the first replica created the owner's credentials

    def token(self) -> str:
        token: str = json.loads((self.owner_home / "credentials").read_text())["token"]
        return token

    def api(self, replica: int = 0) -> httpx.Client:
        return httpx.Client(
            base_url=self.replicas[replica].url,
            headers={"Authorization": f"Bearer {self.token()}"},
            timeout=30.0,
            verify=self.verify,
        )

    def cli(
        self, *args: str, replica: int = 0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {"QL3_URL": self.replicas[replica].url, "QL3_TOKEN": self.token(), **(env or {})}
        return run_cli(*args, home=self.owner_home, env=env)

    def start_replica(
        self,
        name: str,
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        ca: str | None = None,
    ) -> Replica:
        home = self.base / name
        home.mkdir(mode=0o700, exist_ok=True)
        verify: ssl.SSLContext | bool = True if ca is None else ssl.create_default_context(cafile=ca)
        process, url, log_path = start_listener(
            lambda port: [
                *CLI,
                "control",
                "--listen",
                f"127.0.0.1:{port}",
                "--database-url",
                self.db_url,
                "--replica-id",
                name,
                *extra,
            ],
            home=home,
            log_dir=self.base,
            log_stem=name,
            what=f"ql3 control {name}",
            env=env,
            scheme="https" if "--tls-cert" in extra else "http",
            verify=verify,
        )
        self.verify = verify
        replica = Replica(home=home, url=url, process=process, log_path=log_path)
        self.replicas.append(replica)
        return replica

    def worker_token(self, worker_id: str, env: dict[str, str] | None = None) -> Path:
        done = self.cli("worker", "token", "create", worker_id, env=env)
        assert done.returncode == 0, done.stderr
        path = self.base / f"{worker_id}.token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(done.stdout.strip() + "\n")
        return path

    def start_worker(
        self,
        worker_id: str,
        replica: int,
        *extra: str,
        token_file: Path | None = None,
        server: str | None = None,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> Worker:
        """``prefix`` wraps the command (``ip netns exec NS``: a worker in a network namespace)."""
        token_file = token_file or self.worker_token(worker_id)
        home = self.base / f"worker-{worker_id}"
        home.mkdir(mode=0o700, exist_ok=True)
        server = server or self.replicas[replica].url
        log_path = self.base / f"worker-{worker_id}-{time.monotonic_ns()}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *prefix,
                    *CLI,
                    "worker",
                    "--server",
                    server,
                    "--token-file",
                    str(token_file),
                    "--home",
                    str(home / "state"),
                    *extra,
                ],
                env={**base_env(home), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        worker = Worker(
            worker_id=worker_id,
            home=home,
            token_file=token_file,
            server=server,
            process=process,
            log_path=log_path,
            extra=tuple(extra),
        )
        self.workers.append(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.api() as api:
            while time.monotonic() < deadline and process.poll() is None:
                resp = api.get(f"{P}/workers/{worker_id}")
                if resp.status_code == 200 and resp.json()["status"] == "online":
                    return worker
                time.sleep(0.05)
        pytest.fail(f"ql3 worker {worker_id} did not register:\n{log_path.read_text(errors='replace')}")

    def restart_worker(self, worker: Worker, replica: int) -> Worker:
        self.workers.remove(worker)
        return self.start_worker(worker.worker_id, replica, *worker.extra, token_file=worker.token_file)

    def stop_all(self) -> None:
        for worker in self.workers:
            stop(worker.process)
        for replica in self.replicas:
            stop(replica.process)

    def logs(self) -> str:
        parts = [f"--- {r.log_path.name}\n{r.log()[-3000:]}" for r in self.replicas]
        parts += [f"--- {w.log_path.name}\n{w.log()[-3000:]}" for w in self.workers]
        return "\n".join(parts)


def add_task(api: httpx.Client, name: str, command: str, **spec: Any) -> None:
    resp = api.post(f"{P}/tasks", json={"name": name, "command": command, **spec})
    assert resp.status_code == 201, resp.text


def start_runs(api: httpx.Client, task: str, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        resp = api.post(f"{P}/tasks/{task}/runs", json={})
        assert resp.status_code == 201, resp.text
        ids.append(str(resp.json()["id"]))
    return ids


def start_runs_concurrently(
    cluster: Cluster, replicas: list[int], task: str, n: int, *, threads_per_replica: int = 2
) -> list[str]:
    """``n`` runs of ``task`` started through the API of ``replicas``, several requests in flight at
    once (the API has no bulk create), so submission keeps ahead of the workers."""
    clients = [cluster.api(r) for r in replicas for _ in range(threads_per_replica)]
    share = [n // len(clients) + (1 if i < n % len(clients) else 0) for i in range(len(clients))]
    ids: list[list[str]] = [[] for _ in clients]
    errors: list[BaseException] = []

    def submit(i: int) -> None:
        try:
            ids[i] = start_runs(clients[i], task, share[i])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(clients))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        for client in clients:
            client.close()
    assert not errors, errors
    return [run_id for part in ids for run_id in part]


def run_status_counts(db_url: str) -> dict[str, int]:
    """How many runs are in each status (one grouped query, straight from the database)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall()
    return {str(status): int(n) for status, n in rows}


def wait_settled(db_url: str, n: int, timeout_s: float, *, at_least: int | None = None) -> dict[str, int]:
    """Poll the database (every 0.25 s) until ``n`` runs exist and all are terminal - or, with
    ``at_least``, until that many are terminal; the status counts when it stops (or time is up)."""
    terminal = {"succeeded", "failed", "cancelled", "timed_out"}
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = run_status_counts(db_url)
        done = sum(v for k, v in counts.items() if k in terminal)
        if done >= (n if at_least is None else at_least):
            break
        time.sleep(0.25)
    return counts


def wait_terminal(api: httpx.Client, run_ids: list[str], timeout_s: float = SETTLE_S) -> dict[str, str]:
    """Each run's status once all are terminal (or what they are when the time is up)."""
    terminal = {"succeeded", "failed", "cancelled", "timed_out"}
    statuses: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    pending = list(run_ids)
    while pending and time.monotonic() < deadline:
        still = []
        for run_id in pending:
            resp = api.get(f"{P}/runs/{run_id}")
            if resp.status_code == 503:
                # The database is away (a failover): the API says so at once now; ask again.
                still.append(run_id)
                continue
            status = str(resp.json()["status"])
            statuses[run_id] = status
            if status not in terminal:
                still.append(run_id)
        pending = still
        if pending:
            time.sleep(0.2)
    return statuses


class TcpProxy:
    """A TCP forwarder the test controls: ``cut()`` drops every connection and refuses new ones (a
    worker cut off from its replica), ``restore()`` listens again on the same port."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port = upstream_port
        self.host = host
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by cut()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()  # both pumps of a pair close both sockets: closing twice is harmless

    def cut(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
