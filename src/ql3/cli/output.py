"""Output: ``--json`` writes one JSON document; human output is aligned text, at most ``TABLE_WIDTH``
columns wide, with status colours only on a terminal (see ``ql3.cli.human``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Final

from ql3.cli import human

TABLE_WIDTH: Final = 100
MIN_ELASTIC: Final = 8


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def emit_json_error(code: str, message: str, details: Any = None) -> None:
    """An error under ``--json``: one JSON document on stderr, the same code as the text form."""
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    sys.stderr.write(json.dumps({"error": body}, ensure_ascii=False) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    status_column: int | None = None,
    elastic: Sequence[int] = (),
    width: int = TABLE_WIDTH,
) -> None:
    """Aligned columns. When a line would be wider than ``width``, the ``elastic`` columns (names,
    free text) are cut with ``…``, widest first. ``status_column`` is coloured on a terminal."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    overflow = sum(widths) + 2 * (len(widths) - 1) - width
    while overflow > 0:
        shrinkable = [i for i in elastic if widths[i] > max(MIN_ELASTIC, len(headers[i]))]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        overflow -= 1
    colour = human.colour_enabled(sys.stdout) and status_column is not None

    def render(row: Sequence[str], paint: bool) -> str:
        parts = []
        for i, text in enumerate(row):
            shown = _fit(text, widths[i])
            padded = shown.ljust(widths[i])
            if paint and i == status_column:
                padded = human.paint(shown, text, True) + " " * (widths[i] - len(shown))
            parts.append(padded)
        return "  ".join(parts).rstrip()

    lines = [render(list(headers), False)] + [render(row, colour) for row in cells]
    sys.stdout.write("\n".join(lines) + "\n")


def fields(pairs: Iterable[tuple[str, Any]], *, status_key: str | None = "status") -> None:
    items = [(k, _cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    colour = human.colour_enabled(sys.stdout)
    sys.stdout.write(
        "".join(
            f"{k.ljust(width)}  {human.paint(v, v, colour) if k == status_key else v}\n" for k, v in items
        )
    )


def line(text: str) -> None:
    sys.stdout.write(text + "\n")


def note(text: str) -> None:
    sys.stderr.write(text + "\n")


def ids_only(ids: Iterable[str]) -> None:
    """``-q``: one full id a line, nothing else (for ``$(ql3 run list -q)``)."""
    sys.stdout.write("".join(f"{value}\n" for value in ids))
