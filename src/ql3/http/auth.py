"""Bearer-token authentication as a FastAPI dependency."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ql3.application import auth
from ql3.domain.errors import PermissionDenied, StorageBusy, StorageUnavailable
from ql3.domain.model import Principal
from ql3.ports.storage import Database, Transaction

log = logging.getLogger("ql3.http")


async def get_db(request: Request) -> Database:
    """Async, as it does no I/O: FastAPI runs a plain ``def`` dependency in its thread pool, and every
    such hand-off is a thread wake-up on the request's way (bench/README.md, "Idle start latency")."""
    db: Database = request.app.state.db
    return db


DbDep = Annotated[Database, Depends(get_db)]


# auto_error=False: a missing or non-Bearer header reaches ``authenticate`` as None and becomes our
# own ``unauthenticated`` error instead of the framework's 403.
bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <token>`")


def current_principal(
    db: DbDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The authenticated caller; a missing, malformed or unknown token is ``unauthenticated``."""
    token = credentials.credentials if credentials else None
    found = db.transaction(lambda tx: _management_caller(tx, token), write=False)
    if found.needs_touch:
        # last_used_at_ms, at most once a minute per principal (so reads stay reads otherwise). Best
        # effort: when the database cannot take a write (a full disk, a busy writer) the request
        # still goes on, so that reads keep working; the next request tries again.
        try:
            db.transaction(lambda tx: auth.touch(tx, found.principal.id))
        except (StorageUnavailable, StorageBusy):
            log.warning("token use not recorded", extra={"action": "auth.touch_failed"})
    return found.principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]


def refuse_unless_management_caller(tx: Transaction, token: str | None) -> None:
    """``current_principal``'s check alone, for a read transaction: raises as it would refuse, else
    returns (the use is not recorded here; the fast path's write unit checks and records it)."""
    _management_caller(tx, token)


def _management_caller(tx: Transaction, token: str | None) -> auth.Authenticated:
    found = auth.authenticate_use(tx, token)
    if found.principal.kind == "worker":
        # A worker credential speaks only the worker API (docs/cluster.md), never the management one.
        raise PermissionDenied("a worker credential cannot use the management API")
    return found


def principal_in(tx: Transaction, token: str | None) -> Principal:
    """``current_principal`` inside the request's own write unit (the fast path of ``POST
    .../tasks/{task}/runs``, ql3/http/run_intake.py): the same check against the database state, first
    in the unit, and the token's use recorded in the same transaction when it is due."""
    found = _management_caller(tx, token)
    if found.needs_touch:
        auth.touch(tx, found.principal.id)
    return found.principal


def authenticate_caller(tx: Transaction, token: str) -> Principal:
    """``current_principal``'s check in a read transaction (``/metrics``): an unknown, revoked or
    expired token is ``unauthenticated``, a worker credential is refused; the use is not recorded."""
    return _management_caller(tx, token).principal
