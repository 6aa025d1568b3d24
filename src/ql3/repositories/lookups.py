"""Reads for readable CLI output: ids of a project by unique prefix, and principals' names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

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


# The named kinds (``domain/lookup.py`` NAMED_KINDS): rows of (id, name) by id prefix and by name.
_NAMED_PREFIX_QUERIES: Final[dict[str, str]] = {
    "token": "lookup_token_ids",
    "channel": "lookup_channel_ids",
    "subscription": "lookup_subscription_ids",
    "worker": "lookup_worker_ids",
    "rule": "lookup_rule_ids",
}
_NAME_QUERIES: Final[dict[str, str]] = {
    "token": "lookup_token_names",
    "channel": "lookup_channel_names",
    "subscription": "lookup_subscription_names",
    "worker": "lookup_worker_names",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Named:
    """A record found by name or id prefix: its id and the name the API addresses it by."""

    id: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PrincipalName:
    id: str
    name: str
    kind: PrincipalKind


def ids_with_prefix(tx: Transaction, kind: str, *, project_id: str, prefix: str, limit: int) -> list[str]:
    """Ids of ``kind`` in the project that start with ``prefix``, in order, at most ``limit``."""
    params = {"project_id": project_id, "n": len(prefix), "prefix": prefix, "limit": limit}
    return [str(row["id"]) for row in tx.all(_PREFIX_QUERIES[kind], params)]


def named_with_prefix(tx: Transaction, kind: str, *, project_id: str, prefix: str, limit: int) -> list[Named]:
    """Records of a named kind whose id starts with ``prefix``, by id, at most ``limit``."""
    params = {"project_id": project_id, "n": len(prefix), "prefix": prefix, "limit": limit}
    return [_named(row) for row in tx.all(_NAMED_PREFIX_QUERIES[kind], params)]


def named_exactly(tx: Transaction, kind: str, *, project_id: str, name: str, limit: int) -> list[Named]:
    """Records of a named kind called exactly ``name`` (tokens' names may repeat), at most ``limit``."""
    query = _NAME_QUERIES.get(kind)
    if query is None:
        return []
    params = {"project_id": project_id, "name": name, "limit": limit}
    return [_named(row) for row in tx.all(query, params)]


def _named(row: Any) -> Named:
    return Named(id=str(row["id"]), name=str(row["name"]))


def principal_name(tx: Transaction, *, project_id: str, principal_id: str) -> PrincipalName | None:
    """The principal if it has a role in the project or is the owner."""
    row = tx.one("lookup_principal_name", {"id": principal_id, "project_id": project_id})
    if row is None:
        return None
    kind = one_of(row["kind"], PRINCIPAL_KINDS, "principals.kind")
    return PrincipalName(id=str(row["id"]), name=str(row["name"]), kind=kind)
