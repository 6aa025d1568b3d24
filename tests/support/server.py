"""Real processes: ``ql3 serve`` on a temp ``QL3_HOME`` and a free port, and the ``ql3`` CLI against it.

``start_server`` is the one way the suite starts a server. CLI processes a test reads while they run
(``spawn_cli``) are stopped by ``reap_spawned``, which the acceptance conftest calls after each test.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

CLI = [sys.executable, "-m", "ql3.cli.main"]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
CLI_TIMEOUT_S = 60.0
_STARTS = itertools.count(1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL3_")}
    env["QL3_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env={**base_env(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


@dataclass
class Server:
    home: Path
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, home=self.home, env=env)

    def cli_json(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = self.cli(*args, "--json", env=env)
        assert done.returncode == 0, f"{args}: rc={done.returncode} stderr={done.stderr}"
        return json.loads(done.stdout)

    def credentials(self) -> dict[str, str]:
        data: dict[str, str] = json.loads((self.home / "credentials").read_text())
        return data

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def stop(
    process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S
) -> int:
    """Signal, wait with a timeout, kill on timeout; always reaps the process."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=timeout_s)


def start_listener(
    command: Callable[[int], list[str]],
    *,
    home: Path,
    log_dir: Path,
    log_stem: str,
    what: str,
    attempts: int = 3,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    timeout_s: float | None = None,
    scheme: str = "http",
    verify: ssl.SSLContext | bool = True,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start ``command(port)`` (``ql3 serve`` or ``ql3 control``) on a free port and wait for its
    /healthz; retry on another port when the one picked was taken meanwhile. Returns the process, its
    URL and its log file. Log files are numbered across the session: a restart that is handed the same
    port again (the chaos driver restarts one home many times) never overwrites an earlier log."""
    last_log = ""
    for _attempt in range(attempts):
        port = free_port()
        log_path = log_dir / f"{log_stem}-{port}-{next(_STARTS)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command(port),
                env={**base_env(home), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=new_session,
            )
        url = f"{scheme}://127.0.0.1:{port}"
        deadline = time.monotonic() + (timeout_s or START_TIMEOUT_S)
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1.0, verify=verify).status_code == 200:
                    return process, url, log_path
            time.sleep(0.05)
        stop(process)
        last_log = log_path.read_text(errors="replace")
        if "address already in use" not in last_log.lower():
            break
    pytest.fail(f"{what} did not become healthy:\n{last_log}")


def start_server(
    home: Path,
    *extra: str,
    attempts: int = 3,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    timeout_s: float | None = None,
) -> Server:
    """The one way the suite starts ``ql3 serve`` (``start_listener``: a free port, /healthz, a retry
    on a port clash). ``env`` adds variables (``QL3_FAULT``...) to the server's environment;
    ``new_session`` puts it in a session of its own (crash tests kill it with its group intact)."""
    process, url, log_path = start_listener(
        lambda port: [*CLI, "serve", "--listen", f"127.0.0.1:{port}", *extra],
        home=home,
        log_dir=home.parent,
        log_stem=f"serve-{home.name}",
        what="ql3 serve",
        attempts=attempts,
        env=env,
        new_session=new_session,
        timeout_s=timeout_s,
    )
    return Server(home=home, url=url, process=process, log_path=log_path)


# -- following runs and logs (test_cli_logs*, test_cli_wait*, test_cli_workers*) -------------------


_SPAWNED: list[subprocess.Popen[bytes]] = []


def spawn_cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A CLI process whose output the test reads while it runs; stop it with ``stop``. Whatever the
    test leaves behind is stopped and its pipes closed when the test ends (``reap_spawned``)."""
    process = subprocess.Popen(
        [*CLI, *args],
        env={**base_env(home), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    _SPAWNED.append(process)
    return process


def reap_spawned() -> None:
    """Stop every process ``spawn_cli`` started that is still registered and close its pipes."""
    while _SPAWNED:
        process = _SPAWNED.pop()
        stop(process)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def read_until(process: subprocess.Popen[bytes], text: str, timeout_s: float = CLI_TIMEOUT_S) -> str:
    """Read the process's stdout until ``text`` has appeared; fail after ``timeout_s``."""
    import select

    assert process.stdout is not None
    fd = process.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"{text!r} did not appear on stdout; got {seen!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                pytest.fail(f"stdout closed before {text!r} appeared; got {seen!r}")
            seen += chunk
    return seen.decode(errors="replace")


def gated_command(gate: Path, before: str = "one", after: str = "two") -> str:
    """A shell command that prints ``before``, waits (at most 30 s) for ``gate`` to exist, then ``after``."""
    return (
        f"echo {before}; i=0; while [ ! -e '{gate}' ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
        f"echo {after}"
    )


def start_with_env(home: Path, env: dict[str, str]) -> Server:
    """A server in a session of its own, with ``env`` (fault points) added: the crash tests' server."""
    return start_server(home, env=env, new_session=True, timeout_s=START_TIMEOUT_S)


def run_json(server: Server, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = server.cli_json("run", "show", run_id)
    return result
