"""Every ``except Exception`` in src/ either re-raises or leaves a trace: a log call carrying a stable
``action`` code, or the loop's own failure record. A silently swallowed error is how a loop goes quietly
wrong; this test finds a new one before review does."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"

# Calls that record a failure in a way an operator can see (a log line, a health record, a CLI report).
RECORDERS = {"warning", "error", "exception", "_record_failure", "_report", "log_unhandled"}


def _catches_everything(handler: ast.ExceptHandler) -> bool:
    kind = handler.type
    return kind is None or (isinstance(kind, ast.Name) and kind.id in ("Exception", "BaseException"))


def _leaves_a_trace(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if name in RECORDERS:
                return True
    return False


def _silent_handlers() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ExceptHandler)
                and _catches_everything(node)
                and not _leaves_a_trace(node)
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_no_broad_except_swallows_an_error_silently() -> None:
    assert _silent_handlers() == []


def test_the_audit_sees_a_silent_handler() -> None:
    silent = ast.parse("try:\n    f()\nexcept Exception:\n    pass\n").body[0]
    logged = ast.parse("try:\n    f()\nexcept Exception as e:\n    log.warning('x', extra={})\n").body[0]
    assert isinstance(silent, ast.Try) and isinstance(logged, ast.Try)
    assert not _leaves_a_trace(silent.handlers[0]) and _leaves_a_trace(logged.handlers[0])
