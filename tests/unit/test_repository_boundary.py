"""Named queries run only in repositories (docs/architecture.md, "Layers"): a use case asks a
repository of its aggregate and gets frozen records back; it never names a query nor reads a row.

Every use case has moved (the last were the lease fences and the dispatcher): no module outside
``repositories/`` and ``storage/`` may call ``tx.one/all/run`` any more.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"
QUERY_METHODS = {"one", "all", "run"}
# Where running a named query is the module's job.
HOMES = ("repositories/", "storage/")


def _runs_queries(path: Path) -> bool:
    """Whether the module calls ``tx.one/all/run(...)`` on a transaction (by its conventional name)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in QUERY_METHODS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id.lstrip("_") in {"tx", "transaction"}
            and node.args
        ):
            return True
    return False


def _modules_running_queries() -> set[str]:
    found = set()
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC).as_posix()
        if not relative.startswith(HOMES) and _runs_queries(path):
            found.add(relative)
    return found


def test_only_repositories_and_storage_run_named_queries() -> None:
    unexpected = _modules_running_queries()
    assert not unexpected, f"named queries outside repositories: {sorted(unexpected)}"


def test_the_detector_sees_a_query_call(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('def f(tx):\n    return tx.one("get_run", {"id": 1})\n')
    assert _runs_queries(sample)
    sample.write_text("def f(server):\n    server.run(sockets=[])\n")
    assert not _runs_queries(sample)
