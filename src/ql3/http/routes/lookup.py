"""Lookups for readable clients: an id by unique prefix, a principal's name."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel

from ql3.application import auth, lookup
from ql3.http.auth import DbDep, PrincipalDep
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}", tags=["lookup"])

# Reading a run, approval or action needs run.read; a task needs task.read.
# Named kinds: a token needs token.manage, a channel or rule project.admin, a subscription task.read and a
# worker worker.read (what listing them needs).
_PERMISSION = {
    "run": "run.read",
    "approval": "run.read",
    "action": "run.read",
    "task": "task.read",
    "token": "token.manage",
    "channel": "project.admin",
    "rule": "project.admin",
    "subscription": "task.read",
    "worker": "worker.read",
}
_ID_KINDS = ("run", "approval", "action", "task")


class Resolved(BaseModel):
    kind: str
    id: str
    name: str | None = None


class PrincipalOut(BaseModel):
    id: str
    name: str
    kind: str


@router.get("/resolve/{kind}/{prefix}", response_model=Resolved, response_model_exclude_none=True)
def resolve_prefix(
    project: str,
    kind: Literal["run", "approval", "action", "task", "token", "channel", "rule", "subscription", "worker"],
    prefix: Annotated[str, Path(max_length=128)],
    db: DbDep,
    principal: PrincipalDep,
) -> Resolved:
    """The one id of ``kind`` starting with ``prefix`` (at least 4 characters). 404 ``not_found`` when
    none does; 409 ``ambiguous_id`` with up to 5 ``candidates`` in the details when several do.

    Tokens, channels, subscriptions and workers are also found by their exact name (a worker's is its
    id), which wins over a prefix; ``name`` is what the other routes address them by."""

    def unit(tx: Transaction) -> Resolved:
        found = auth.authorize(tx, principal, project, _PERMISSION[kind])
        if kind in _ID_KINDS:
            return Resolved(kind=kind, id=lookup.resolve_prefix(tx, found.id, kind, prefix))
        named = lookup.resolve_ref(tx, found.id, kind, prefix)
        return Resolved(kind=kind, id=named.id, name=named.name)

    return db.transaction(unit, write=False)


@router.get("/principals/{principal_id}", response_model=PrincipalOut)
def show_principal(
    project: str,
    principal_id: Annotated[str, Path(max_length=128)],
    db: DbDep,
    principal: PrincipalDep,
) -> PrincipalOut:
    """The name and kind of a principal with a role in the project (who requested or decided)."""

    def unit(tx: Transaction) -> PrincipalOut:
        found = auth.authorize(tx, principal, project, "run.read")
        named = lookup.principal_name(tx, found.id, principal_id)
        return PrincipalOut(id=named.id, name=named.name, kind=named.kind)

    return db.transaction(unit, write=False)
