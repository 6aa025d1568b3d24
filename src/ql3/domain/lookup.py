"""Finding a record by a unique prefix of its id (what the CLI's short ids are)."""

from __future__ import annotations

import re
from typing import Final

from ql3.domain.errors import Conflict, NotFound, ValidationFailed

LOOKUP_KINDS: Final = ("run", "approval", "action", "task")
# Kinds looked up by name first, then by a unique id prefix (``resolve_ref``). A worker's "name" is its
# whole id (worker ids are chosen by people and may be short); its prefix keeps its case.
NAMED_KINDS: Final = ("token", "channel", "subscription", "worker", "rule")
NAMED_BY: Final = {"token": True, "channel": True, "subscription": True, "worker": True, "rule": False}
CASE_KEPT: Final = frozenset({"worker"})
MAX_REF: Final = 128
# Ids are lowercase UUIDv7 strings or client ids like ``idem.<hex>``: letters, digits and . : -
PREFIX_RE: Final = re.compile(r"^[0-9a-z][0-9a-z.:-]{0,127}$")
MIN_PREFIX: Final = 4
MAX_CANDIDATES: Final = 5


class AmbiguousPrefix(Conflict):
    """More than one id starts with that prefix; give more characters."""

    code = "ambiguous_id"


class PrefixNotFound(NotFound):
    """No id starts with that prefix."""


def validate_prefix(prefix: str, *, fold: bool = True) -> str:
    """A lowercase id prefix of at least ``MIN_PREFIX`` characters (shorter ones match too much).

    ``fold=False`` keeps the case (worker ids may have capitals) but checks the same characters."""
    value = prefix.lower() if fold else prefix
    if len(value) < MIN_PREFIX or not PREFIX_RE.fullmatch(value.lower()):
        raise ValidationFailed(
            f"an id prefix is at least {MIN_PREFIX} characters: letters, digits, '.', ':' or '-'",
            field="prefix",
        )
    return value
