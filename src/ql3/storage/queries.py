"""Loads named SQL (``-- name: x``) from ``.sql`` files: a shared catalogue plus dialect overrides."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)
_PARAM_RE = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


def _parse(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    parts = _NAME_RE.split(text)
    for i in range(1, len(parts), 2):
        name, body = parts[i], parts[i + 1].strip().rstrip(";").strip()
        if name in out:
            raise ValueError(f"duplicate query name {name}")
        out[name] = body
    return out


def _read(package: str, filename: str) -> str:
    return resources.files(package).joinpath(filename).read_text(encoding="utf-8")


@cache
def catalogue(dialect: str) -> dict[str, str]:
    """Every named query for ``dialect``, in that dialect's parameter style."""
    merged: dict[str, str] = {}
    for filename in sorted(p.name for p in resources.files("ql3.storage.sql").iterdir()):
        if filename.endswith(".sql"):
            for name, body in _parse(_read("ql3.storage.sql", filename)).items():
                if name in merged:
                    raise ValueError(f"duplicate query name {name}")
                merged[name] = body
    package = f"ql3.storage.{dialect}"
    for filename in sorted(p.name for p in resources.files(package).iterdir()):
        if filename.endswith(".sql") and filename != "schema.sql":
            merged.update(_parse(_read(package, filename)))
    if dialect == "postgres":
        return {k: _PARAM_RE.sub(r"%(\1)s", v.replace("%", "%%")) for k, v in merged.items()}
    return merged
