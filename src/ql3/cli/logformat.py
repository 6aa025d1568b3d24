"""The server's log line: time, level, logger, message, then the record's structured fields.

ql3 logs a stable message plus ``extra`` fields (``action``, ``loop``, ``code``, ``error_type``...).
The standard formatter drops ``extra``, which left ``cycle failed`` lines without the loop or the error;
this one appends them as ``key=value``. Callers put only low-sensitivity values there (names, codes,
exception types, counts); values are still made single-line and bounded, and so is the whole line.
"""

from __future__ import annotations

import logging
import re
from typing import Final, TextIO

FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
MAX_VALUE_CHARS: Final = 80
MAX_LINE_CHARS: Final = 2048
# Attributes every LogRecord has, and ones libraries add that are not ours to print.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
_FOREIGN: Final = frozenset({"color_message"})
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.:/@+-]")


def _value(value: object) -> str:
    if isinstance(value, bool | int | float):
        return str(value)
    if not isinstance(value, str):
        return type(value).__name__  # never a repr: it could carry anything
    text = _UNSAFE.sub("_", value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "~"


class FieldsFormatter(logging.Formatter):
    """``FORMAT`` plus `` key=value`` for each structured field, in the order they were given."""

    def __init__(self) -> None:
        super().__init__(FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(
            f"{key}={_value(value)}"
            for key, value in vars(record).items()
            if key not in _STANDARD and key not in _FOREIGN and not key.startswith("_")
        )
        if fields:
            head, sep, tail = line.partition("\n")  # fields stay on the first line, before a traceback
            line = f"{head} {fields}{sep}{tail}"
        return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "~"


def configure(stream: TextIO) -> None:
    """Log INFO and above to ``stream`` (the server's stderr) with ``FieldsFormatter``."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(FieldsFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
