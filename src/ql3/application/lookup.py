"""Ids by unique prefix, and the names of principals, for readable CLI output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import NotFound
from ql3.domain.lookup import MAX_CANDIDATES, AmbiguousPrefix, PrefixNotFound, validate_prefix
from ql3.ports.storage import Transaction

_QUERIES: Final[dict[str, str]] = {
    "run": "lookup_run_ids",
    "approval": "lookup_approval_ids",
    "action": "lookup_action_ids",
    "task": "lookup_task_ids",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PrincipalName:
    id: str
    name: str
    kind: str


def resolve_prefix(tx: Transaction, project_id: str, kind: str, prefix: str) -> str:
    """The one id of ``kind`` in the project that starts with ``prefix``.

    Raises ``PrefixNotFound`` when none does and ``AmbiguousPrefix`` (with up to ``MAX_CANDIDATES``
    candidates in its details) when several do. Reads at most ``MAX_CANDIDATES + 1`` rows.
    """
    value = validate_prefix(prefix)
    rows = tx.all(
        _QUERIES[kind],
        {"project_id": project_id, "n": len(value), "prefix": value, "limit": MAX_CANDIDATES + 1},
    )
    ids = [str(r["id"]) for r in rows]
    if not ids:
        raise PrefixNotFound(f"no {kind} id starts with that prefix", kind=kind)
    if len(ids) > 1:
        raise AmbiguousPrefix(
            f"several {kind} ids start with that prefix; give more characters",
            kind=kind,
            candidates=ids[:MAX_CANDIDATES],
            more=len(ids) > MAX_CANDIDATES,
        )
    return ids[0]


def principal_name(tx: Transaction, project_id: str, principal_id: str) -> PrincipalName:
    """The name and kind of a principal that has a role in the project (or is the owner)."""
    row = tx.one("lookup_principal_name", {"id": principal_id, "project_id": project_id})
    if row is None:
        raise NotFound("principal not found")
    return PrincipalName(id=str(row["id"]), name=str(row["name"]), kind=str(row["kind"]))
