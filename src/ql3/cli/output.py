"""Output: ``--json`` writes one JSON document; human output is plain aligned text (never ANSI)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    lines += ["  ".join(text.ljust(widths[i]) for i, text in enumerate(row)).rstrip() for row in cells]
    sys.stdout.write("\n".join(lines) + "\n")


def fields(pairs: Iterable[tuple[str, Any]]) -> None:
    items = [(k, _cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    sys.stdout.write("".join(f"{k.ljust(width)}  {v}\n" for k, v in items))


def line(text: str) -> None:
    sys.stdout.write(text + "\n")


def note(text: str) -> None:
    sys.stderr.write(text + "\n")
