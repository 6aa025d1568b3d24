"""Imports point inward only: edges -> application -> ports -> domain (architecture.md section 2)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"
# What each layer may import from ql3. Adapters are imported only by bootstrap (and tests).
ALLOWED = {
    "domain": {"domain"},
    "ports": {"domain", "ports"},
    "application": {"domain", "ports", "repositories", "application"},
    # The only callers of named queries; they return frozen domain records (docs/architecture.md).
    "repositories": {"domain", "ports", "repositories"},
    "storage": {"domain", "ports", "storage"},
    "execution": {"domain", "ports", "execution"},  # the adapters behind ports/execution.py
    # The control plane only through its port; the execution adapters and the journal store only in
    # the worker's composition root (ROOT_ONLY below).
    "worker": {"domain", "ports", "worker", "execution"},
    "http": {"domain", "ports", "application", "http", "console"},
    "console": {"domain", "console"},
    "notify": {"domain", "ports", "notify"},
    "vcs": {"domain", "ports", "vcs"},  # the git command behind ports/vcs.py (subscriptions)
    # Cluster mode (docs/cluster.md): the worker API (an HTTP edge), its HTTP client (a worker-side
    # ControlPlane adapter) and the runtimes wiring both; like bootstrap, it composes the layers. The
    # pull service reads workers, leases and the queue through their repositories like a use case.
    "cluster": {
        "domain",
        "ports",
        "application",
        "repositories",
        "http",
        "worker",
        "execution",
        "bootstrap",
        "cluster",
        "notify",
        "vcs",
    },
    "cli": {"domain", "ports", "application", "cli", "http", "bootstrap", "worker", "console", "cluster"},
}


# The worker's parts depend on the execution ports (ports/execution.py): only its composition root
# names the adapters behind them (docs/architecture.md, "Layers"). What the shim leaves on disk and in
# /proc (identity, receipts, logs) is read directly: those modules are formats, not adapters.
WORKER_ROOT = "worker/agent.py"
ROOT_ONLY = ("ql3.execution.launcher", "ql3.execution.controller", "ql3.worker.journal")
JOURNAL_PACKAGE = "worker/journal/"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _layer_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for name in _imported_modules(path):
        parts = name.split(".")
        if parts[0] == "ql3" and len(parts) > 1:
            found.add(parts[1])
    return found


def _root_only_imports(relative: str, path: Path) -> set[str]:
    """The adapter modules a worker module other than the composition root imports."""
    if relative == WORKER_ROOT or relative.startswith(JOURNAL_PACKAGE):
        return set()
    return {m for m in _imported_modules(path) if any(m == r or m.startswith(r + ".") for r in ROOT_ONLY)}


def test_every_layer_imports_only_inward() -> None:
    violations: list[str] = []
    for layer, allowed in ALLOWED.items():
        for path in (SRC / layer).rglob("*.py"):
            bad = _layer_imports(path) - allowed
            if bad:
                violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert violations == []


def test_the_worker_parts_reach_the_execution_adapters_only_through_ports() -> None:
    violations: list[str] = []
    for path in sorted((SRC / "worker").rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        bad = _root_only_imports(relative, path)
        if bad:
            violations.append(f"{relative} imports {sorted(bad)}")
    assert violations == []


def test_the_worker_checker_sees_an_adapter_import(tmp_path: Path) -> None:
    # Given a worker part that imports the launcher, the process controller and the journal store
    fake = tmp_path / "probe.py"
    fake.write_text(
        "from ql3.execution.launcher import LocalLauncher\n"
        "import ql3.execution.controller\n"
        "from ql3.worker.journal.store import WorkerJournal\n"
        "from ql3.execution.receipts import read_receipt\n"
    )

    # Then each adapter is flagged, the receipt format is not, and the composition root may do it
    assert _root_only_imports("worker/intake.py", fake) == {
        "ql3.execution.launcher",
        "ql3.execution.controller",
        "ql3.worker.journal.store",
    }
    assert _root_only_imports(WORKER_ROOT, fake) == set()


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    # Given a domain module that imports an adapter, the rule must flag it.
    fake = tmp_path / "probe.py"
    fake.write_text("from ql3.storage.sqlite.adapter import SqliteDatabase\n")

    assert _layer_imports(fake) - ALLOWED["domain"] == {"storage"}
