"""Ids by unique prefix, the names of principals, and a run's attempt by its number: what readable
CLI output and the run routes look up."""

from __future__ import annotations

from ql3.application import runs
from ql3.domain.errors import NotFound
from ql3.domain.lookup import (
    CASE_KEPT,
    MAX_CANDIDATES,
    MAX_REF,
    NAMED_BY,
    AmbiguousPrefix,
    PrefixNotFound,
    validate_prefix,
)
from ql3.domain.model import Attempt
from ql3.ports.storage import Transaction
from ql3.repositories import lookups as lookup_store
from ql3.repositories import runs as run_store
from ql3.repositories.lookups import Named as Named
from ql3.repositories.lookups import PrincipalName as PrincipalName


def resolve_prefix(tx: Transaction, project_id: str, kind: str, prefix: str) -> str:
    """The one id of ``kind`` in the project that starts with ``prefix``.

    Raises ``PrefixNotFound`` when none does and ``AmbiguousPrefix`` (with up to ``MAX_CANDIDATES``
    candidates in its details) when several do. Reads at most ``MAX_CANDIDATES + 1`` rows.
    """
    value = validate_prefix(prefix)
    ids = lookup_store.ids_with_prefix(
        tx, kind, project_id=project_id, prefix=value, limit=MAX_CANDIDATES + 1
    )
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


def resolve_ref(tx: Transaction, project_id: str, kind: str, ref: str) -> Named:
    """The one record of a named kind (token, channel, subscription, worker, rule) that ``ref`` names.

    An exact name wins (a token's name may be shared: several are ``AmbiguousPrefix`` listing their
    ids); else ``ref`` is a unique id prefix as in ``resolve_prefix``. Reads at most
    ``2 * (MAX_CANDIDATES + 1)`` rows.
    """
    if not isinstance(ref, str) or not ref or len(ref) > MAX_REF:
        raise PrefixNotFound(f"no {kind} is named that", kind=kind)
    if NAMED_BY[kind]:
        limit = MAX_CANDIDATES + 1
        named = lookup_store.named_exactly(tx, kind, project_id=project_id, name=ref, limit=limit)
        if len(named) == 1:
            return named[0]
        if named:
            raise _ambiguous(kind, [n.id for n in named], what="are named that")
    value = validate_prefix(ref, fold=kind not in CASE_KEPT)
    found = lookup_store.named_with_prefix(
        tx, kind, project_id=project_id, prefix=value, limit=MAX_CANDIDATES + 1
    )
    if not found:
        raise PrefixNotFound(f"no {kind} is named that or has an id starting with it", kind=kind)
    if len(found) > 1:
        raise _ambiguous(kind, [n.id for n in found], what="have an id starting with that")
    return found[0]


def _ambiguous(kind: str, ids: list[str], *, what: str) -> AmbiguousPrefix:
    return AmbiguousPrefix(
        f"several {kind}s {what}; give more characters or the id",
        kind=kind,
        candidates=ids[:MAX_CANDIDATES],
        more=len(ids) > MAX_CANDIDATES,
    )


def principal_name(tx: Transaction, project_id: str, principal_id: str) -> PrincipalName:
    """The name and kind of a principal that has a role in the project (or is the owner)."""
    found = lookup_store.principal_name(tx, project_id=project_id, principal_id=principal_id)
    if found is None:
        raise NotFound("principal not found")
    return found


def attempt_of(tx: Transaction, run_id: str, number: int | None) -> Attempt | None:
    """The run's attempt with this number, or its latest one (None before it has any) when
    ``number`` is None. A number the run never had is ``NotFound``."""
    if number is None:
        return runs.latest_attempt(tx, run_id)
    for attempt in run_store.list_attempts(tx, run_id):
        if attempt.attempt == number:
            return attempt
    raise NotFound("attempt not found")
