"""``scripts/serve`` installs the runtime only: no test, lint or browser tool reaches a served install.

The real ``scripts/serve`` is executed in a copy of the repository whose ``.venv/bin/python`` records
its arguments instead of running pip, so the test sees the exact install command the script issues
(``-e .``, ``.[dev]``, a requirements file, a package by name...). The requirement closure of what
that command asks for is then resolved from ``pyproject.toml`` and the installed distributions'
metadata, with environment markers evaluated (and ``extra`` markers only for the extras actually
requested), and checked against the development tools. Putting pytest into the runtime dependencies,
or making the script install ``.[dev]``, fails this test.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# Development tools that must never be part of a served install, whatever the dev extra says today.
DEV_TOOLS = frozenset(
    {
        "pytest",
        "pytest-xdist",
        "pytest-cov",
        "coverage",
        "hypothesis",
        "schemathesis",
        "mypy",
        "ruff",
        "playwright",
        "mutmut",
    }
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_requirements(pyproject: Mapping[str, Any], extras: Iterable[str]) -> list[Requirement]:
    project = pyproject["project"]
    found = [Requirement(text) for text in project.get("dependencies", [])]
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise AssertionError(f"the install asks for extra {extra!r}, not defined in pyproject.toml")
        found.extend(Requirement(text) for text in optional[extra])
    return found


def _applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""}))


def closure(pyproject: Mapping[str, Any], extras: Iterable[str], names: Iterable[str] = ()) -> set[str]:
    """Canonical names of every distribution that installing the project with ``extras`` (and the
    named extra packages) pulls in, resolved through the installed metadata with markers evaluated."""
    project_name = canonical(pyproject["project"]["name"])
    base = len(pyproject["project"].get("dependencies", []))
    pending: list[tuple[Requirement, frozenset[str]]] = [
        (r, frozenset()) for r in _project_requirements(pyproject, extras)
    ]
    pending.extend((Requirement(n), frozenset()) for n in names)
    seen: dict[str, set[str]] = {}
    project_extras: set[str] = set(extras)
    while pending:
        requirement, parent_extras = pending.pop()
        if not _applies(requirement, parent_extras):
            continue
        name = canonical(requirement.name)
        wanted = set(requirement.extras)
        if name == project_name:
            # The project naming itself with extras (``ql3[dev]``) adds those extras, once.
            new = wanted - project_extras
            project_extras.update(new)
            pending.extend((r, frozenset()) for r in _project_requirements(pyproject, new)[base:])
            continue
        if name in seen and wanted <= seen[name]:
            continue
        seen.setdefault(name, set()).update(wanted)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            # Not installed here, so its own requirements cannot be read: it is still part of the set.
            continue
        active = frozenset(seen[name])
        pending.extend((Requirement(text), active) for text in requires)
    return set(seen)


_OPTIONS_WITH_VALUE = frozenset({"-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f"})


def _install_targets(argv: list[str]) -> tuple[set[str], set[str], list[str]]:
    """(extras of the project, other packages by name, requirement files) of one pip install argv."""
    extras: set[str] = set()
    names: set[str] = set()
    files: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-e", "--editable"):
            arg = next(args)
        elif arg in ("-r", "--requirement"):
            files.append(next(args))
            continue
        elif arg in _OPTIONS_WITH_VALUE:
            next(args)
            continue
        elif arg.startswith("-"):
            continue
        match = re.fullmatch(r"(\.|\./|file:\S*|/\S*)(?:\[([^\]]*)\])?", arg)
        if match is not None:
            extras.update(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
        else:
            names.add(arg)
    return extras, names, files


def serve_install_commands(tmp_path: Path) -> list[list[str]]:
    """Run the real ``scripts/serve`` in a copy of the repository with a recording python; the argv of
    every ``python -m pip install`` it issued."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "serve", repo / "scripts" / "serve")
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    record = tmp_path / "python-calls"
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done >> {record}\nprintf "\\n" >> {record}\n'
    )
    ql3 = bin_dir / "ql3"
    ql3.write_text("#!/bin/sh\nexit 0\n")
    for script in (python, ql3):
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON")}
    env["PYTHON"] = str(python)
    done = subprocess.run(
        ["bash", str(repo / "scripts" / "serve"), "--help"], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    calls = []
    for line in record.read_bytes().split(b"\n"):
        argv = [a.decode() for a in line.split(b"\0") if a]
        if argv[:3] == ["-m", "pip", "install"]:
            calls.append(argv[3:])
    return calls


def runtime_install(tmp_path: Path) -> set[str]:
    """Everything the install commands of ``scripts/serve`` pull in (canonical names)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    calls = serve_install_commands(tmp_path)
    assert calls, "scripts/serve issued no pip install in a fresh checkout"
    installed: set[str] = set()
    for argv in calls:
        extras, names, files = _install_targets(argv)
        for file in files:
            lines = (tmp_path / "repo" / file).read_text().splitlines()
            names.update(ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip())
        installed |= closure(pyproject, extras, names)
    return installed


def test_scripts_serve_installs_no_development_tool(tmp_path: Path) -> None:
    installed = runtime_install(tmp_path)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    optional = pyproject["project"]["optional-dependencies"]
    # (the bench extra, matplotlib for bench/plot.py, is no more runtime than the dev tools)
    tools = {canonical(Requirement(t).name) for extra in ("dev", "bench") for t in optional.get(extra, [])}
    forbidden = DEV_TOOLS | tools
    assert not installed & forbidden, f"scripts/serve would install {sorted(installed & forbidden)}"
    # What serving needs is there: the web stack and both database drivers' dependencies.
    assert {"fastapi", "uvicorn", "psycopg", "cronsim"} <= installed


def test_scripts_serve_installs_the_project_without_extras(tmp_path: Path) -> None:
    calls = serve_install_commands(tmp_path)
    assert calls
    for argv in calls:
        extras, names, files = _install_targets(argv)
        assert (extras, names, files) == (set(), set(), []), argv


@pytest.mark.parametrize(
    ("dependencies", "extras", "leaked"),
    [
        (["fastapi>=0.110", "pytest>=8"], (), "pytest"),
        (["fastapi>=0.110"], ("dev",), "mypy"),
        (["fastapi>=0.110", "ql3[dev]"], (), "ruff"),
        # A marker that holds everywhere still counts; an extra marker counts only when asked for.
        (['hypothesis; python_version >= "3"'], (), "hypothesis"),
    ],
)
def test_the_closure_sees_a_development_tool_however_it_gets_in(
    dependencies: list[str], extras: tuple[str, ...], leaked: str
) -> None:
    pyproject = {
        "project": {
            "name": "ql3",
            "dependencies": dependencies,
            "optional-dependencies": {"dev": ["pytest>=8", "mypy>=1.10", "ruff>=0.5"]},
        }
    }
    assert leaked in closure(pyproject, extras)


def test_extra_only_requirements_are_not_counted_without_the_extra() -> None:
    pyproject = {"project": {"name": "ql3", "dependencies": ["fastapi>=0.110"]}}
    found = closure(pyproject, ())
    assert "fastapi" in found and "starlette" in found
    # fastapi's optional "standard"/"all" extras are not pulled without being asked for.
    assert "fastapi-cli" not in found and "email-validator" not in found


def test_the_install_command_parser_sees_extras_files_and_names() -> None:
    assert _install_targets(["-q", "-e", ".[dev]"]) == ({"dev"}, set(), [])
    assert _install_targets(["-q", "-e", "."]) == (set(), set(), [])
    assert _install_targets(["-r", "requirements-dev.txt", "."]) == (set(), set(), ["requirements-dev.txt"])
    assert _install_targets(["pytest", "-c", "constraints.txt", "./"]) == (set(), {"pytest"}, [])
