"""A private repository's token is sealed at rest (docs/scripts.md "Private repositories"): a real
``ql3 serve`` syncs a repository from a local smart-HTTP git server (``git http-backend``) that
answers only with that token, while its database holds no plaintext of it; a plaintext credential
left by an older version is sealed by the restarted server, and syncs still work."""

from __future__ import annotations

import base64
import http.server
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Server, start_server, stop

pytestmark = pytest.mark.slow
TOKEN = "ghp_private-repo-token-0123456789abcdef"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": os.environ["PATH"],
}


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)


class PrivateGitServer:
    """Smart HTTP over ``git http-backend`` (CGI), refusing (401) a request without the token as
    ``x-access-token`` basic credentials; every request's answer is recorded."""

    def __init__(self, root: Path) -> None:
        self.statuses: list[int] = []
        backend = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True)
        program = str(Path(backend.stdout.strip()) / "git-http-backend")
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                if self.headers.get("Authorization") != expected:
                    outer.statuses.append(401)
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {
                    "GIT_PROJECT_ROOT": str(root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "REMOTE_USER": "x-access-token",
                    "PATH": os.environ["PATH"],
                    "GIT_CONFIG_GLOBAL": os.devnull,
                    "GIT_CONFIG_NOSYSTEM": "1",
                }
                done = subprocess.run([program], input=body, env=env, capture_output=True, timeout=60)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                headers = [line.split(":", 1) for line in head.decode().split("\r\n") if ":" in line]
                status = next((int(v.split()[0]) for k, v in headers if k.lower() == "status"), 200)
                outer.statuses.append(status)
                self.send_response(status)
                for key, value in headers:
                    if key.lower() != "status":
                        self.send_header(key, value.strip())
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _serve
            do_POST = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/repo.git"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def private_repo(tmp_path: Path) -> Iterator[PrivateGitServer]:
    work = tmp_path / "work"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    (work / "checkin.sh").write_text("#!/bin/sh\n# cron: 15 6 * * *\necho private-checked-in\n")
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "first", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(tmp_path / "repo.git"), cwd=tmp_path)
    server = PrivateGitServer(tmp_path)
    try:
        yield server
    finally:
        server.close()


def _stored(server: Server) -> dict[str, str | None]:
    with sqlite3.connect(server.home / "ql3.db") as db:
        return dict(db.execute("SELECT name, deploy_key FROM subscriptions").fetchall())


def _scripts(server: Server) -> list[str]:
    listed = server.cli_json("script", "list")
    return sorted(str(s["path"]) for s in listed["items"])


def test_a_private_repository_syncs_with_a_token_sealed_at_rest(
    tmp_path: Path, private_repo: PrivateGitServer
) -> None:
    token_file = tmp_path / "token.txt"
    token_file.write_text(TOKEN + "\n")
    home = tmp_path / "home"
    server = start_server(home)
    try:
        # Given a subscription to a repository that answers only with its token
        url = private_repo.url
        added = server.cli(
            "subscription", "add", "private", "--repo", url, "--token-file", str(token_file), "--sync"
        )
        # and one without the token
        server.cli_json("subscription", "add", "anonymous", "--repo", private_repo.url)
        anonymous = server.cli("subscription", "sync", "anonymous")
        stored = _stored(server)
        scripts = _scripts(server)
    finally:
        stop(server.process)

    # Then the sync with the token fetched the repository, the one without was refused by the server,
    # and the database holds the token only sealed
    assert added.returncode == 0, added.stdout + added.stderr
    assert "created task checkin.sh" in added.stdout and TOKEN not in added.stdout
    assert anonymous.returncode == 1 and 401 in private_repo.statuses and 200 in private_repo.statuses
    assert scripts == ["checkin.sh"]
    sealed = stored["private"]
    assert sealed is not None and sealed.startswith("aesgcm1:") and TOKEN not in sealed
    assert stored["anonymous"] is None
    raw = b"".join(p.read_bytes() for p in home.glob("ql3.db*"))
    assert TOKEN.encode() not in raw


def test_a_plaintext_credential_of_an_older_version_is_sealed_by_the_next_start(
    tmp_path: Path, private_repo: PrivateGitServer
) -> None:
    home = tmp_path / "home"
    server = start_server(home)
    server.cli_json("subscription", "add", "private", "--repo", private_repo.url)
    stop(server.process)
    # Given the credential as an older version stored it, in plaintext
    with sqlite3.connect(home / "ql3.db") as db:
        db.execute("UPDATE subscriptions SET deploy_key = ? WHERE name = 'private'", (f"token:{TOKEN}",))

    # When the server starts again
    server = start_server(home)
    try:
        deadline = time.monotonic() + 30
        while (_stored(server)["private"] or "").startswith("token:") and time.monotonic() < deadline:
            time.sleep(0.1)
        stored = _stored(server)
        synced = server.cli("subscription", "sync", "private")
        scripts = _scripts(server)
    finally:
        stop(server.process)

    # Then it is sealed, and the sync still uses it
    sealed = stored["private"]
    assert sealed is not None and sealed.startswith("aesgcm1:") and TOKEN not in sealed
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert scripts == ["checkin.sh"]
