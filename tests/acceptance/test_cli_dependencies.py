"""``ql3 deps``: a Python dependency installed from a wheel the test builds (no registry), used by a
task through PATH; bad specs exit 64 and change nothing (docs/dependencies.md)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import stat
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Server, start_server, stop

# One server per xdist worker for the module; each test sets up what it needs, so their order and the
# worker each runs on do not matter.

NPM_PACKAGE = {
    "package/package.json": b'{"name":"ql3demo-js","version":"1.0.0","main":"index.js"}',
    "package/index.js": b'module.exports = { value: "from-the-tarball" };\n',
}


class NpmRegistry:
    """A registry on loopback with one package (its packument and the tarball the test builds)."""

    def __init__(self) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for name, data in NPM_PACKAGE.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
        tarball = buffer.getvalue()
        outer = self
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                base = outer.url.rstrip("/")
                if self.path == "/ql3demo-js/-/ql3demo-js-1.0.0.tgz":
                    body = tarball
                elif self.path == "/ql3demo-js":
                    version = {
                        "name": "ql3demo-js",
                        "version": "1.0.0",
                        "main": "index.js",
                        "dist": {
                            "tarball": f"{base}/ql3demo-js/-/ql3demo-js-1.0.0.tgz",
                            "integrity": integrity,
                        },
                    }
                    packument = {
                        "name": "ql3demo-js",
                        "dist-tags": {"latest": "1.0.0"},
                        "versions": {"1.0.0": version},
                    }
                    body = json.dumps(packument).encode()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def build_wheel(directory: Path, name: str, version: str, module_text: str) -> Path:
    """A minimal pure-Python wheel (PEP 427): the module, METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": module_text.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture(scope="module")
def deps_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("deps")
    wheels = root / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "ql3demo", "1.0", 'VALUE = "from-the-wheel"\n')
    user_home = root / "user"
    user_home.mkdir()
    registry = NpmRegistry()
    env = {
        "HOME": str(user_home),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "npm_config_registry": registry.url,
        "npm_config_cache": str(root / "npm-cache"),
        "npm_config_update_notifier": "false",
    }
    server = start_server(root / "home", env=env)
    try:
        yield server, user_home
    finally:
        stop(server.process)
        registry.close()


def test_a_python_dependency_is_installed_by_a_run_and_tasks_import_it(
    deps_server: tuple[Server, Path],
) -> None:
    server, user_home = deps_server

    added = server.cli("deps", "add", "python", "ql3demo==1.*", "--follow")

    assert added.returncode == 0, added.stdout + added.stderr
    assert "ql3 deps: installed: ql3demo==1.*" in added.stdout
    assert "succeeded" in added.stdout
    listed = server.cli_json("deps", "list")
    assert [(d["kind"], d["name"], d["spec"]) for d in listed["items"]] == [
        ("python", "ql3demo", "ql3demo==1.*")
    ]
    # The project's set lives under the task user's home, private to it.
    project_dirs = list((user_home / ".ql3-deps").iterdir())
    assert len(project_dirs) == 1
    assert stat.S_IMODE(project_dirs[0].stat().st_mode) == 0o700
    assert (project_dirs[0] / "current" / "venv" / "bin" / "python").exists()

    made = server.cli(
        "task", "add", "uses-dep", "--command", "python3 -c 'import ql3demo; print(ql3demo.VALUE)'"
    )
    assert made.returncode == 0, made.stderr
    ran = server.cli("run", "start", "uses-dep", "--follow")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "from-the-wheel" in ran.stdout


def _python_set_installed(server: Server) -> None:
    """The project's set holds the wheel's package, installed (a no-op when it already does)."""
    added = server.cli("deps", "add", "python", "ql3demo==1.*", "--follow")
    assert added.returncode == 0, added.stdout + added.stderr


def test_a_failed_install_keeps_the_installed_set(deps_server: tuple[Server, Path]) -> None:
    server, user_home = deps_server
    _python_set_installed(server)
    # Not in the local wheel directory: pip fails, and the set already installed stays in place.
    failed = server.cli("deps", "add", "python", "surely-not-here-ql3==9.9", "--follow")
    try:
        assert failed.returncode == 2, failed.stdout + failed.stderr
        assert "No matching distribution found for surely-not-here-ql3" in failed.stdout
        project_dir = next((user_home / ".ql3-deps").iterdir())
        builds = sorted(p.name for p in project_dir.iterdir() if p.name.startswith("build-"))
        assert len(builds) == 1, builds  # the failed build was removed
        # current still names the set installed before, whose package is in place.
        assert builds == [os.readlink(project_dir / "current")]
        assert list((project_dir / "current" / "venv").glob("lib/python*/site-packages/ql3demo.py"))
    finally:
        assert server.cli("deps", "rm", "python", "surely-not-here-ql3").returncode == 0


def test_a_node_dependency_from_a_local_registry_is_required_by_a_task(
    deps_server: tuple[Server, Path],
) -> None:
    if shutil.which("npm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("npm is needed under CI to install node dependencies")
        pytest.skip("npm is not installed")
    server, _ = deps_server
    _python_set_installed(server)

    added = server.cli("deps", "add", "node", "ql3demo-js@^1.0", "--follow")

    assert added.returncode == 0, added.stdout + added.stderr
    made = server.cli(
        "task", "add", "uses-js", "--command", "node -e 'console.log(require(\"ql3demo-js\").value)'"
    )
    assert made.returncode == 0, made.stderr
    ran = server.cli("run", "start", "uses-js", "--follow")
    assert ran.returncode == 0 and "from-the-tarball" in ran.stdout, ran.stdout + ran.stderr
    # The whole set was installed again, the Python package with it.
    assert "ql3 deps: installed: ql3demo==1.* ql3demo-js@^1.0" in added.stdout


def test_bad_specs_exit_64_and_change_nothing(deps_server: tuple[Server, Path]) -> None:
    server, _ = deps_server
    before = server.cli_json("deps", "list")

    for kind, spec in [("python", "evil @ https://example.invalid/e.whl"), ("node", "../x")]:
        refused = server.cli("deps", "add", kind, spec)
        assert refused.returncode == 64, refused.stderr
        assert "not a valid" in refused.stderr or "direct URL" in refused.stderr

    assert server.cli_json("deps", "list") == before
