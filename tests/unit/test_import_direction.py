"""Imports point inward only: edges -> application -> ports -> domain (architecture.md section 2)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"
# What each layer may import from ql3. Adapters are imported only by bootstrap (and tests).
ALLOWED = {
    "domain": {"domain"},
    "ports": {"domain", "ports"},
    "application": {"domain", "ports", "application"},
    "storage": {"domain", "ports", "storage"},
    "execution": {"domain", "execution"},
    "worker": {"domain", "ports", "worker", "execution"},  # the control plane only through its port
    "http": {"domain", "ports", "application", "http", "console"},
    "console": {"domain", "console"},
    "notify": {"domain", "ports", "notify"},
    # Cluster mode (docs/cluster.md): the worker API (an HTTP edge), its HTTP client (a worker-side
    # ControlPlane adapter) and the runtimes wiring both; like bootstrap, it composes the layers.
    "cluster": {
        "domain",
        "ports",
        "application",
        "http",
        "worker",
        "execution",
        "bootstrap",
        "cluster",
        "notify",
    },
    "cli": {"domain", "ports", "application", "cli", "http", "bootstrap", "worker", "console", "cluster"},
}


def _layer_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ql3" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_layer_imports_only_inward() -> None:
    violations: list[str] = []
    for layer, allowed in ALLOWED.items():
        for path in (SRC / layer).rglob("*.py"):
            bad = _layer_imports(path) - allowed
            if bad:
                violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert violations == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    # Given a domain module that imports an adapter, the rule must flag it.
    fake = tmp_path / "probe.py"
    fake.write_text("from ql3.storage.sqlite.adapter import SqliteDatabase\n")

    assert _layer_imports(fake) - ALLOWED["domain"] == {"storage"}
