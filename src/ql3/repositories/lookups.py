"""Reads for readable CLI output: ids of a project by unique prefix, and principals' names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.auth import PRINCIPAL_KINDS, PrincipalKind
from ql3.ports.storage import Transaction
from ql3.repositories.mapping import one_of

# The ids of each kind (``domain/lookup.py`` LOOKUP_KINDS) in a project, by prefix.
_PREFIX_QUERIES: Final[dict[str, str]] = {
    "run": "lookup_run_ids",
    "approval": "lookup_approval_ids",
    "action": "lookup_action_ids",
    "task": "lookup_task_ids",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PrincipalName:
    id: str
    name: str
    kind: PrincipalKind


def ids_with_prefix(tx: Transaction, kind: str, *, project_id: str, prefix: str, limit: int) -> list[str]:
    """Ids of ``kind`` in the project that start with ``prefix``, in order, at most ``limit``."""
    params = {"project_id": project_id, "n": len(prefix), "prefix": prefix, "limit": limit}
    return [str(row["id"]) for row in tx.all(_PREFIX_QUERIES[kind], params)]


def principal_name(tx: Transaction, *, project_id: str, principal_id: str) -> PrincipalName | None:
    """The principal if it has a role in the project or is the owner."""
    row = tx.one("lookup_principal_name", {"id": principal_id, "project_id": project_id})
    if row is None:
        return None
    kind = one_of(row["kind"], PRINCIPAL_KINDS, "principals.kind")
    return PrincipalName(id=str(row["id"]), name=str(row["name"]), kind=kind)
