"""Loads named SQL (``-- name: x``) from ``.sql`` files: a shared catalogue plus dialect overrides.

Each name line is followed by one description line, ``-- desc: what the query returns or changes``.
The description is read here and kept out of the SQL body sent to the database; a dialect override
carries its own description, which replaces the shared one.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import NamedTuple

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)
_DESC_RE = re.compile(r"\A[ \t]*\n?--\s*desc:[ \t]*(.*?)[ \t]*(?:\n|\Z)")
_PARAM_RE = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


class _Query(NamedTuple):
    description: str  # empty when the name line has no ``-- desc:`` line after it
    body: str


def _parse(text: str) -> dict[str, _Query]:
    out: dict[str, _Query] = {}
    parts = _NAME_RE.split(text)
    for i in range(1, len(parts), 2):
        name, rest = parts[i], parts[i + 1]
        found = _DESC_RE.match(rest)
        description = found.group(1) if found else ""
        if found:
            rest = rest[found.end() :]
        if name in out:
            raise ValueError(f"duplicate query name {name}")
        out[name] = _Query(description, rest.strip().rstrip(";").strip())
    return out


def _read(package: str, filename: str) -> str:
    return resources.files(package).joinpath(filename).read_text(encoding="utf-8")


@cache
def _entries(dialect: str) -> dict[str, _Query]:
    merged: dict[str, _Query] = {}
    for filename in sorted(p.name for p in resources.files("ql3.storage.sql").iterdir()):
        if filename.endswith(".sql"):
            for name, query in _parse(_read("ql3.storage.sql", filename)).items():
                if name in merged:
                    raise ValueError(f"duplicate query name {name}")
                merged[name] = query
    package = f"ql3.storage.{dialect}"
    for filename in sorted(p.name for p in resources.files(package).iterdir()):
        if filename.endswith(".sql") and filename != "schema.sql":
            merged.update(_parse(_read(package, filename)))
    return merged


@cache
def catalogue(dialect: str) -> dict[str, str]:
    """Every named query for ``dialect``, in that dialect's parameter style."""
    bodies = {name: query.body for name, query in _entries(dialect).items()}
    if dialect == "postgres":
        return {k: _PARAM_RE.sub(r"%(\1)s", v.replace("%", "%%")) for k, v in bodies.items()}
    return bodies


def descriptions(dialect: str) -> dict[str, str]:
    """Every named query's one-line description for ``dialect`` (empty when its file gives none)."""
    return {name: query.description for name, query in _entries(dialect).items()}
