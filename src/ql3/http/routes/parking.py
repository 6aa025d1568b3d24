"""Parked items (docs/operations.md "Parked items"): what the control loops set aside after a
non-transient failure, and the retry-now action.

A project's parked items are read by any member (``run.read``) and retried by an operator or admin
(``run.stop``). Every item (also one of no project) is seen server-wide by the owner or an
admin of the default project, like worker drain.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from ql3.application import auth, parking
from ql3.domain.auth import role_allows
from ql3.domain.errors import NotFound, PermissionDenied
from ql3.domain.model import Principal
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import ParkedItemOut, ParkedItemPage
from ql3.ports.storage import Transaction

router = APIRouter(tags=["parked items"])

Kind = Annotated[str, Path(pattern=r"^[a-z]{1,32}$", description="the item's kind, e.g. approval")]
Key = Annotated[str, Path(min_length=1, max_length=128, description="the item's id")]
Limit = Annotated[int, Query(ge=1, le=parking.MAX_LIST)]


def _page(page: parking.ParkedPage) -> ParkedItemPage:
    return ParkedItemPage(
        items=[ParkedItemOut(**parking.item_view(i)) for i in page.items], truncated=page.truncated
    )


def _require_server_wide(tx: Transaction, principal: Principal) -> None:
    if principal.is_owner:
        return
    try:
        project = auth.resolve_project(tx, auth.DEFAULT_PROJECT)
    except NotFound:
        raise PermissionDenied(permission="worker.manage") from None
    role = auth.role_in(tx, principal, project)
    if role is None or not role_allows(role, "worker.manage"):
        raise PermissionDenied(permission="worker.manage")


@router.get("/api/v1/projects/{project}/parked-items", response_model=ParkedItemPage)
def list_project_parked(
    project: str, db: DbDep, principal: PrincipalDep, limit: Limit = parking.MAX_LIST
) -> ParkedItemPage:
    """The project's parked items, the most recent failure first; ``truncated`` when there are more."""

    def unit(tx: Transaction) -> ParkedItemPage:
        found = auth.authorize(tx, principal, project, "run.read")
        return _page(parking.list_project(tx, found, limit=limit))

    return db.transaction(unit, write=False)


@router.post("/api/v1/projects/{project}/parked-items/{kind}/{key}/retry", response_model=ParkedItemOut)
def retry_project_parked(
    project: str, kind: Kind, key: Key, db: DbDep, principal: PrincipalDep
) -> ParkedItemOut:
    """Make the item due at once: its loop retries it on its next cycle (woken now)."""

    def unit(tx: Transaction) -> ParkedItemOut:
        found = auth.authorize(tx, principal, project, "run.stop")
        item = parking.retry_now(tx, item_kind=kind, item_key=key, project=found)
        return ParkedItemOut(**parking.item_view(item))

    return db.transaction(unit)


@router.get("/api/v1/parked-items", response_model=ParkedItemPage)
def list_all_parked(db: DbDep, principal: PrincipalDep, limit: Limit = parking.MAX_LIST) -> ParkedItemPage:
    """Every parked item of the server, items of no project included. Owner or admin of ``default``."""

    def unit(tx: Transaction) -> ParkedItemPage:
        _require_server_wide(tx, principal)
        return _page(parking.list_all(tx, limit=limit))

    return db.transaction(unit, write=False)


@router.post("/api/v1/parked-items/{kind}/{key}/retry", response_model=ParkedItemOut)
def retry_any_parked(kind: Kind, key: Key, db: DbDep, principal: PrincipalDep) -> ParkedItemOut:
    """Retry-now for any parked item. Owner or admin of ``default``."""

    def unit(tx: Transaction) -> ParkedItemOut:
        _require_server_wide(tx, principal)
        return ParkedItemOut(
            **parking.item_view(parking.retry_now(tx, item_kind=kind, item_key=key, project=None))
        )

    return db.transaction(unit)
