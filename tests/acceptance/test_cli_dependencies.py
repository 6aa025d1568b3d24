"""``ql3 deps``: a Python dependency installed from a wheel the test builds (no registry), used by a
task through PATH; bad specs exit 64 and change nothing (docs/dependencies.md)."""

from __future__ import annotations

import base64
import hashlib
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import Server, start_server, stop


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
    env = {"HOME": str(user_home), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    server = start_server(root / "home", env=env)
    try:
        yield server, user_home
    finally:
        stop(server.process)


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


def test_a_failed_install_keeps_the_installed_set(deps_server: tuple[Server, Path]) -> None:
    server, user_home = deps_server
    # Not in the local wheel directory: pip fails, and the set already installed stays in place.
    failed = server.cli("deps", "add", "python", "surely-not-here-ql3==9.9", "--follow")

    assert failed.returncode == 2, failed.stdout + failed.stderr
    project_dir = next((user_home / ".ql3-deps").iterdir())
    builds = sorted(p.name for p in project_dir.iterdir() if p.name.startswith("build-"))
    assert len(builds) == 1, builds  # the failed build was removed
    ran = server.cli("run", "start", "uses-dep", "--follow")
    assert ran.returncode == 0 and "from-the-wheel" in ran.stdout
    assert server.cli("deps", "rm", "python", "surely-not-here-ql3").returncode == 0


def test_bad_specs_exit_64_and_change_nothing(deps_server: tuple[Server, Path]) -> None:
    server, _ = deps_server
    before = server.cli_json("deps", "list")

    for kind, spec in [("python", "evil @ https://example.invalid/e.whl"), ("node", "../x")]:
        refused = server.cli("deps", "add", kind, spec)
        assert refused.returncode == 64, refused.stderr
        assert "not a valid" in refused.stderr or "direct URL" in refused.stderr

    assert server.cli_json("deps", "list") == before
