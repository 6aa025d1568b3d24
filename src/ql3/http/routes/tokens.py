"""The caller's identity (``whoami``) and the lifecycle of a project's tokens: list, revoke, rotate.

No response carries a token's digest; a raw token appears only in the response that created it
(``POST /tokens`` or ``/rotate``). See docs/security.md ("Tokens").
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel

from ql3.application import auth
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import TokenRotate
from ql3.ports.storage import Transaction

router = APIRouter(tags=["tokens"])


class WhoamiOut(BaseModel):
    principal_id: str
    name: str
    kind: Literal["user", "service", "worker"]
    is_owner: bool
    roles: dict[str, str]  # project name -> role


class TokenItem(BaseModel):
    id: str
    name: str
    role: str
    created_at_ms: int
    expires_at_ms: int | None
    revoked_at_ms: int | None
    last_used_at_ms: int | None


class TokenList(BaseModel):
    items: list[TokenItem]
    next_cursor: str | None = None


class RotatedOut(TokenItem):
    token: str


def _item(record: auth.TokenRecord) -> TokenItem:
    return TokenItem(
        id=record.id,
        name=record.name,
        role=record.role,
        created_at_ms=record.created_at_ms,
        expires_at_ms=record.expires_at_ms,
        revoked_at_ms=record.revoked_at_ms,
        last_used_at_ms=record.last_used_at_ms,
    )


@router.get("/api/v1/whoami", response_model=WhoamiOut)
def whoami(db: DbDep, principal: PrincipalDep) -> WhoamiOut:
    """The principal behind the presented token and its role in each project (any valid token)."""

    def unit(tx: Transaction) -> WhoamiOut:
        kind: Literal["user", "service", "worker"] = (
            "service" if principal.kind == "service" else "worker" if principal.kind == "worker" else "user"
        )
        return WhoamiOut(
            principal_id=principal.id,
            name=principal.name,
            kind=kind,
            is_owner=principal.is_owner,
            roles=auth.roles_of(tx, principal),
        )

    return db.transaction(unit, write=False)


@router.get("/api/v1/projects/{project}/tokens", response_model=TokenList)
def list_tokens(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[
        str | None, Query(max_length=128, description="the last id of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=auth.MAX_TOKEN_PAGE)] = 200,
) -> TokenList:
    """The project's principals and their tokens' lifecycle, revoked ones included (admin)."""

    def unit(tx: Transaction) -> TokenList:
        found = auth.authorize(tx, principal, project, "token.manage")
        records = auth.list_tokens(tx, found, after=cursor or "", limit=limit)
        next_cursor = records[-1].id if len(records) == limit else None
        return TokenList(items=[_item(r) for r in records], next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.post("/api/v1/projects/{project}/tokens/{token_id}/revoke", response_model=TokenItem)
def revoke_token(project: str, token_id: str, db: DbDep, principal: PrincipalDep) -> TokenItem:
    """Revoke a token: it is refused (401) from the next request on. Repeating it changes nothing."""

    def unit(tx: Transaction) -> TokenItem:
        found = auth.authorize(tx, principal, project, "token.manage")
        return _item(auth.revoke_token(tx, principal, found, token_id))

    return db.transaction(unit)


@router.post(
    "/api/v1/projects/{project}/tokens/{token_id}/rotate",
    response_model=RotatedOut,
    status_code=status.HTTP_201_CREATED,
)
def rotate_token(
    project: str, token_id: str, db: DbDep, principal: PrincipalDep, body: TokenRotate | None = None
) -> RotatedOut:
    """A new token for the same principal and role; the old token is refused at once. Shown once.

    Only the owner rotates the owner's token.
    """

    def unit(tx: Transaction) -> RotatedOut:
        found = auth.authorize(tx, principal, project, "token.manage")
        rotated = auth.rotate_token(
            tx, principal, found, token_id, expires_in_s=body.expires_in_s if body else None
        )
        return RotatedOut(token=rotated.token, **_item(rotated.record).model_dump())

    return db.transaction(unit)
