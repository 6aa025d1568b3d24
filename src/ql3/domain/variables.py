"""Project variables and secrets (docs/variables.md): names, values, notes, limits, import formats.

Every task of a project receives its enabled variables in its environment; a task's own ``env`` value
wins. A secret's value is write-only: no response, event, log line or notification carries it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final

from ql3.domain.errors import ValidationFailed
from ql3.domain.tasks import ENV_KEY_RE

MAX_VARIABLES: Final = 128
MAX_VALUE_BYTES: Final = 64 * 1024
MAX_TOTAL_BYTES: Final = 256 * 1024
MAX_NOTE_CHARS: Final = 256
MAX_IMPORT_BYTES: Final = 1024 * 1024
KEY_RULE: Final = "a variable name is a letter or '_' then letters, digits or '_' (at most 128)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Variable:
    """One project variable as stored; ``value`` is the plaintext (the caller decrypted a secret)."""

    name: str
    value: str = field(repr=False)
    secret: bool
    enabled: bool = True
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class VariableInfo:
    """What a management surface may show: a secret's value is never part of it."""

    name: str
    secret: bool
    enabled: bool
    note: str
    value: str | None  # None for a secret (and for a plain value the caller may not read)
    updated_at_ms: int


def validate_key(name: object) -> str:
    if not isinstance(name, str) or not ENV_KEY_RE.fullmatch(name):
        raise ValidationFailed(f"invalid variable name: {KEY_RULE}", field="name")
    return name


def validate_value(value: object) -> str:
    """Text without NUL within the size cap; the value is never echoed in an error."""
    if not isinstance(value, str) or "\x00" in value:
        raise ValidationFailed("a variable value is text without NUL characters", field="value")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValidationFailed("a variable value must be valid text", field="value") from None
    if size > MAX_VALUE_BYTES:
        raise ValidationFailed(f"a variable value is at most {MAX_VALUE_BYTES} bytes", field="value")
    return value


def validate_note(note: object) -> str:
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS or not (note.isprintable() or note == ""):
        raise ValidationFailed(f"a note is at most {MAX_NOTE_CHARS} printable characters", field="note")
    return note


def check_totals(variables: list[Variable]) -> None:
    """The project's variables together fit in a task's environment (docs/variables.md "Limits")."""
    if len(variables) > MAX_VARIABLES:
        raise ValidationFailed(f"a project has at most {MAX_VARIABLES} variables", field="name")
    total = sum(len(v.name) + len(v.value.encode()) for v in variables)
    if total > MAX_TOTAL_BYTES:
        raise ValidationFailed(f"a project's variables are at most {MAX_TOTAL_BYTES} bytes", field="value")


def environment(variables: list[Variable]) -> dict[str, str]:
    """The environment the project gives its tasks: enabled variables by name."""
    return {v.name: v.value for v in sorted(variables, key=lambda v: v.name) if v.enabled}


def parse_import(text: str) -> list[Variable]:
    """Variables from an export: QingLong's JSON export (a list of objects with ``name``, ``value``,
    ``remarks`` and ``status``, 1 meaning disabled) or ``KEY=VALUE`` lines (``export`` and quotes
    allowed, ``#`` comments). Nothing is secret here; the caller marks secrets. Raises on the first
    bad entry, naming its line or position, never its value."""
    if len(text.encode()) > MAX_IMPORT_BYTES:
        raise ValidationFailed(f"an import file is at most {MAX_IMPORT_BYTES} bytes", field="file")
    stripped = text.lstrip()
    if stripped.startswith("[") or stripped.startswith("{"):
        return _parse_json(stripped)
    return _parse_lines(text)


def _parse_json(text: str) -> list[Variable]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"the import file is not valid JSON (line {exc.lineno})", field="file"
        ) from None
    if isinstance(data, dict):  # QingLong's API answers {"code": 200, "data": [...]}
        data = data.get("data")
    if not isinstance(data, list):
        raise ValidationFailed("a JSON import is a list of {name, value, remarks, status}", field="file")
    out: list[Variable] = []
    for i, entry in enumerate(data, 1):
        if not isinstance(entry, dict):
            raise ValidationFailed(f"entry {i} is not an object", field="file")
        try:
            name, value = validate_key(entry.get("name")), validate_value(entry.get("value"))
            note = validate_note(entry.get("remarks") or "")
        except ValidationFailed as exc:
            raise ValidationFailed(f"entry {i}: {exc}", field="file") from None
        out.append(
            Variable(name=name, value=value, secret=False, enabled=entry.get("status", 0) != 1, note=note)
        )
    return out


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _parse_lines(text: str) -> list[Variable]:
    out: list[Variable] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        name, sep, value = line.partition("=")
        if not sep:
            raise ValidationFailed(f"line {number} is not KEY=VALUE", field="file")
        try:
            out.append(
                Variable(
                    name=validate_key(name.strip()),
                    value=validate_value(_unquote(value.strip())),
                    secret=False,
                )
            )
        except ValidationFailed as exc:
            raise ValidationFailed(f"line {number}: {exc}", field="file") from None
    return out


MASK: Final = "***"
MIN_MASKED_CHARS: Final = 3  # shorter secrets would mask ordinary text ("1", "on")


def mask(text: str, secrets: list[str]) -> str:
    """``text`` with every occurrence of a secret value replaced by ``***`` (longest first, so a
    secret that contains another is masked whole)."""
    for value in sorted((v for v in secrets if len(v) >= MIN_MASKED_CHARS), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def mask_bytes(data: bytes, secrets: list[str]) -> bytes:
    """``mask`` for raw log bytes (a secret's UTF-8 form)."""
    for value in sorted((v for v in secrets if len(v) >= MIN_MASKED_CHARS), key=len, reverse=True):
        data = data.replace(value.encode(), MASK.encode())
    return data
