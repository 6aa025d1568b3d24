"""Authentication as a FastAPI dependency: a bearer token, or else the console's session cookie
(with its CSRF token on state-changing requests; docs/security.md "Console sign-in")."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ql3.application import auth, sessions
from ql3.domain.errors import PermissionDenied, StorageBusy, StorageUnavailable, Unauthenticated
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


SESSION_COOKIE = "ql3_session"
CSRF_HEADER = "X-CSRF-Token"
# Requests that change nothing: a cookie session needs no CSRF token for these.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CsrfRefused(PermissionDenied):
    """A state-changing request from a console session without its CSRF token (header X-CSRF-Token)."""

    code = "csrf_token_invalid"


def current_principal(
    request: Request,
    db: DbDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The authenticated caller; a missing, malformed or unknown token is ``unauthenticated``.

    Without an ``Authorization`` header, the console's session cookie authenticates instead; a
    state-changing method then needs the session's CSRF token in ``X-CSRF-Token`` (403
    ``csrf_token_invalid``). A bearer token is never combined with the cookie."""
    token = credentials.credentials if credentials else None
    if token is None and request.headers.get("authorization") is None:
        secret = request.cookies.get(SESSION_COOKIE)
        if secret:
            return session_principal(request, db, secret)
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


def session_principal(request: Request, db: Database, secret: str) -> Principal:
    """The principal of a live console session (``unauthenticated`` otherwise), its CSRF token
    checked on a state-changing method, its use recorded when due (best effort, as a token's)."""
    found = db.transaction(lambda tx: sessions.authenticate_session(tx, secret), write=False)
    if found is None:
        raise Unauthenticated()
    if request.method not in SAFE_METHODS and not sessions.csrf_matches(
        secret, request.headers.get(CSRF_HEADER)
    ):
        raise CsrfRefused()
    if found.needs_touch:
        try:
            db.transaction(lambda tx: sessions.touch(tx, found.session))
        except (StorageUnavailable, StorageBusy):
            log.warning("session use not recorded", extra={"action": "session.touch_failed"})
    return found.principal


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
