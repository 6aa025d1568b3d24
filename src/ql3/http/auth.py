"""Bearer-token authentication as a FastAPI dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ql3.application import auth
from ql3.domain.errors import PermissionDenied
from ql3.domain.model import Principal
from ql3.ports.storage import Database


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


DbDep = Annotated[Database, Depends(get_db)]


# auto_error=False: a missing or non-Bearer header reaches ``authenticate`` as None and becomes our
# own ``unauthenticated`` error instead of the framework's 403.
_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <token>`")


def current_principal(
    db: DbDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The authenticated caller; a missing, malformed or unknown token is ``unauthenticated``."""
    token = credentials.credentials if credentials else None
    found = db.transaction(lambda tx: auth.authenticate_use(tx, token), write=False)
    if found.principal.kind == "worker":
        # A worker credential speaks only the worker API (docs/cluster.md), never the management one.
        raise PermissionDenied("a worker credential cannot use the management API")
    if found.needs_touch:
        # last_used_at_ms, at most once a minute per principal (so reads stay reads otherwise)
        db.transaction(lambda tx: auth.touch(tx, found.principal.id))
    return found.principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]
