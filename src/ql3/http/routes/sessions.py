"""Console sign-in with a name and a password into a cookie session, the caller's sessions, and the
management of a project's users: passwords, TOTP, sessions (docs/security.md "Console sign-in").

The session cookie is HttpOnly, SameSite=Strict, Secure when the request came over https, and lasts
the session's absolute lifetime (so it survives a new tab and a browser restart). No response carries a
password hash or a session's secret other than the cookie that sign-in sets.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import BaseModel, Field

from ql3.application import auth, sessions
from ql3.domain.errors import Ql3Error, Unauthenticated
from ql3.domain.model import Principal
from ql3.http.auth import SESSION_COOKIE, DbDep, PrincipalDep, session_principal
from ql3.http.dto import NAME_SCHEMA, Body
from ql3.http.routes.variables import BoxDep
from ql3.ports.storage import Transaction

router = APIRouter(tags=["sessions"])


class SignInFailed(Unauthenticated):
    """Wrong name, password or TOTP code."""

    code = "signin_failed"


class TotpRequired(Unauthenticated):
    """This user signs in with a TOTP code as well: send it as ``totp``."""

    code = "totp_required"


class SignInLocked(Ql3Error):
    """Too many failed sign-ins: try again later."""

    code = "signin_locked"
    http_status = 429


class SignIn(Body):
    name: str = Field(min_length=1, max_length=128)
    password: str = Field(min_length=1, max_length=sessions.MAX_PASSWORD)
    totp: str | None = Field(default=None, max_length=16)


class SessionOut(BaseModel):
    id: str
    principal_id: str
    created_at_ms: int
    last_seen_at_ms: int
    idle_expires_at_ms: int
    expires_at_ms: int
    revoked_at_ms: int | None
    client: str
    user_agent: str
    current: bool = False


class SessionPage(BaseModel):
    items: list[SessionOut]


class SignedIn(BaseModel):
    principal_id: str
    name: str
    csrf_token: str  # send as X-CSRF-Token on every state-changing request of this session
    session: SessionOut


def _session_out(s: sessions.Session, current_id: str | None = None) -> SessionOut:
    return SessionOut(
        id=s.id,
        principal_id=s.principal_id,
        created_at_ms=s.created_at_ms,
        last_seen_at_ms=s.last_seen_at_ms,
        idle_expires_at_ms=s.last_seen_at_ms + s.idle_timeout_ms,
        expires_at_ms=s.expires_at_ms,
        revoked_at_ms=s.revoked_at_ms,
        client=s.client,
        user_agent=s.user_agent,
        current=s.id == current_id,
    )


def _policy(request: Request) -> sessions.SessionPolicy:
    policy: sessions.SessionPolicy = request.app.state.session_policy
    return policy


def _limiter(request: Request) -> sessions.AddressLimiter:
    limiter: sessions.AddressLimiter = request.app.state.signin_limiter
    return limiter


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _locked(retry_after_ms: int) -> SignInLocked:
    return SignInLocked(retry_after_s=max(1, -(-retry_after_ms // 1000)))


@router.post(
    "/api/v1/session",
    response_model=SignedIn,
    responses={429: {"description": "signin_locked: too many failed attempts (details.retry_after_s)"}},
)
def sign_in(body: SignIn, request: Request, response: Response, db: DbDep, box: BoxDep) -> SignedIn:
    """Sign in with a user name and password (and ``totp`` when the user has TOTP): sets the
    session cookie and returns the CSRF token. 401 ``signin_failed`` (any wrong part; the same for an
    unknown name), 401 ``totp_required`` (the password was right: send the code too), 429
    ``signin_locked`` after too many failures of the name or from the client address."""
    policy, limiter, client = _policy(request), _limiter(request), _client(request)
    seen, now = db.transaction(lambda tx: (sessions.read_login(tx, body.name), tx.now_ms()), write=False)
    address_lock = limiter.locked_until(client, now)
    if address_lock is not None:
        raise _locked(address_lock - now)
    if seen is not None and seen.locked_until_ms is not None and seen.locked_until_ms > now:
        limiter.failed(client, now)  # hammering a locked name counts against the address too
        raise _locked(seen.locked_until_ms - now)
    # The slow hash is checked outside any transaction; an unknown name costs the same.
    if seen is None:
        sessions.burn_verification(body.password)
        password_ok = False
    else:
        password_ok = sessions.verify_password(seen.password_hash, body.password)
    agent = request.headers.get("user-agent", "")
    result = db.transaction(
        lambda tx: sessions.complete_sign_in(
            tx,
            policy,
            box,
            seen=seen,
            password_ok=password_ok,
            totp=body.totp,
            client=client,
            user_agent=agent,
        )
    )
    if result.outcome == "totp_required":
        raise TotpRequired()
    if result.outcome != "ok" or result.created is None:
        limiter.failed(client, now)
        if result.outcome == "locked":
            raise _locked(result.retry_after_ms)
        raise SignInFailed()
    limiter.succeeded(client)
    created = result.created
    response.set_cookie(
        SESSION_COOKIE,
        created.secret,
        max_age=policy.max_ms // 1000,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return SignedIn(
        principal_id=created.principal.id,
        name=created.principal.name,
        csrf_token=created.csrf_token,
        session=_session_out(created.session, created.session.id),
    )


def _cookie_session(request: Request, db: DbDep) -> tuple[sessions.SessionUse, str]:
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret or request.headers.get("authorization") is not None:
        raise Unauthenticated()
    session_principal(request, db, secret)  # the CSRF check of a state-changing method, and the touch
    found = db.transaction(lambda tx: sessions.authenticate_session(tx, secret), write=False)
    if found is None:
        raise Unauthenticated()
    return found, secret


CookieSession = Annotated[tuple[sessions.SessionUse, str], Depends(_cookie_session)]


@router.get("/api/v1/session", response_model=SignedIn)
def current_session(found: CookieSession) -> SignedIn:
    """The console session of the cookie, with its CSRF token (a new tab reads it here); 401 without
    a live session."""
    use, secret = found
    return SignedIn(
        principal_id=use.principal.id,
        name=use.principal.name,
        csrf_token=sessions.csrf_token(secret),
        session=_session_out(use.session, use.session.id),
    )


@router.delete("/api/v1/session", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def sign_out(found: CookieSession, request: Request, db: DbDep) -> Response:
    """Sign out: the session is revoked (refused from now on, wherever its cookie is) and the cookie
    cleared. Needs the CSRF token."""
    use, _ = found
    db.transaction(lambda tx: sessions.sign_out(tx, use.session.id))
    answer = Response(status_code=status.HTTP_204_NO_CONTENT)
    answer.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return answer


def _current_id(request: Request, db: DbDep) -> str | None:
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret or request.headers.get("authorization") is not None:
        return None
    found = db.transaction(lambda tx: sessions.authenticate_session(tx, secret), write=False)
    return None if found is None else found.session.id


@router.get("/api/v1/sessions", response_model=SessionPage)
def my_sessions(request: Request, db: DbDep, principal: PrincipalDep) -> SessionPage:
    """The caller's live console sessions, newest first (``current``: the one making this request)."""
    current = _current_id(request, db)
    items = db.transaction(lambda tx: sessions.list_own_sessions(tx, principal), write=False)
    return SessionPage(items=[_session_out(s, current) for s in items])


@router.post("/api/v1/sessions/{session_id}/revoke", response_model=SessionOut)
def revoke_my_session(session_id: str, db: DbDep, principal: PrincipalDep) -> SessionOut:
    """Revoke one of the caller's own sessions (idempotent); 404 for anyone else's."""
    return _session_out(db.transaction(lambda tx: sessions.revoke_own_session(tx, principal, session_id)))


# -- a project's users ----------------------------------------------------------------------------


NewPassword = Annotated[
    str,
    Field(
        min_length=sessions.MIN_PASSWORD,
        max_length=sessions.MAX_PASSWORD,
        pattern=r"^[^\x00]*$",
        description="8-1024 characters, no NUL",
    ),
]


class UserIn(Body):
    name: str = Field(min_length=1, max_length=128, json_schema_extra=NAME_SCHEMA)
    password: NewPassword
    role: Literal["viewer", "operator", "approver", "admin", "metrics"] = "viewer"
    attach_to_caller: bool = Field(
        default=False, description="give the caller itself this sign-in name (role is then ignored)"
    )


class PasswordIn(Body):
    password: NewPassword


class UserOut(BaseModel):
    name: str
    principal_id: str
    totp: bool
    locked_until_ms: int | None
    failed_count: int
    created_at_ms: int


class UserPage(BaseModel):
    items: list[UserOut]
    next_cursor: str | None = None


class RevokedCount(BaseModel):
    sessions_revoked: int


class TotpOut(BaseModel):
    name: str
    secret: str
    uri: str


def _user_out(login: sessions.Login) -> UserOut:
    return UserOut(
        name=login.login,
        principal_id=login.principal.id,
        totp=login.totp_sealed is not None,
        locked_until_ms=login.locked_until_ms,
        failed_count=login.failed_count,
        created_at_ms=login.created_at_ms,
    )


def _managed(
    project: str, permission: str, db: DbDep, principal: Principal, fn: Any, *, write: bool = True
) -> Any:
    def unit(tx: Transaction) -> Any:
        found = auth.authorize(tx, principal, project, permission)
        return fn(tx, found)

    return db.transaction(unit, write=write)


@router.get("/api/v1/projects/{project}/users", response_model=UserPage)
def list_users(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    # a sign-in name is text: a NUL byte (which PostgreSQL refuses in text) is a 422, not a 500
    cursor: Annotated[str, Query(max_length=128, pattern=r"^[^\x00]*$")] = "",
    limit: Annotated[int, Query(ge=1, le=sessions.MAX_USER_PAGE)] = 100,
) -> UserPage:
    """The sign-in names of the project's principals, by name (admins: ``token.manage``)."""
    found: list[sessions.Login] = _managed(
        project,
        "token.manage",
        db,
        principal,
        lambda tx, p: sessions.list_users(tx, p, after=cursor, limit=limit),
        write=False,
    )
    return UserPage(
        items=[_user_out(x) for x in found], next_cursor=found[-1].login if len(found) == limit else None
    )


@router.post("/api/v1/projects/{project}/users", response_model=UserOut, status_code=status.HTTP_201_CREATED)
def create_user(project: str, body: UserIn, db: DbDep, principal: PrincipalDep) -> UserOut:
    """A user who signs in to the console with ``name`` and ``password``: a new principal with
    ``role`` in the project, or the caller itself (``attach_to_caller``). Needs ``token.create``."""
    password_hash = sessions.hash_password(body.password)
    created: sessions.Login = _managed(
        project,
        "token.create",
        db,
        principal,
        lambda tx, p: sessions.create_user(
            tx,
            principal,
            p,
            login=body.name,
            role=body.role,
            password_hash=password_hash,
            attach_to_caller=body.attach_to_caller,
        ),
    )
    return _user_out(created)


@router.post("/api/v1/projects/{project}/users/{name}/password", response_model=RevokedCount)
def set_password(
    project: str, name: str, body: PasswordIn, db: DbDep, principal: PrincipalDep
) -> RevokedCount:
    """A new password: the name's lock-out is cleared and every session of the user revoked."""
    password_hash = sessions.hash_password(body.password)
    revoked: int = _managed(
        project,
        "token.manage",
        db,
        principal,
        lambda tx, p: sessions.set_user_password(tx, principal, p, name, password_hash),
    )
    return RevokedCount(sessions_revoked=revoked)


@router.delete("/api/v1/projects/{project}/users/{name}", response_model=RevokedCount)
def remove_user(project: str, name: str, db: DbDep, principal: PrincipalDep) -> RevokedCount:
    """Remove the sign-in name and revoke its sessions (the principal and its token stay)."""
    revoked: int = _managed(
        project, "token.manage", db, principal, lambda tx, p: sessions.remove_user(tx, principal, p, name)
    )
    return RevokedCount(sessions_revoked=revoked)


@router.post("/api/v1/projects/{project}/users/{name}/totp", response_model=TotpOut)
def enable_totp(project: str, name: str, db: DbDep, principal: PrincipalDep, box: BoxDep) -> TotpOut:
    """A new TOTP secret for the user, shown once (``uri``: an otpauth:// URI for an authenticator
    app); from now on sign-in needs a code. Sealed at rest like project secrets."""
    enabled: sessions.TotpEnabled = _managed(
        project,
        "token.manage",
        db,
        principal,
        lambda tx, p: sessions.enable_totp(tx, principal, p, name, box),
    )
    return TotpOut(name=enabled.login, secret=enabled.secret, uri=enabled.uri)


@router.delete(
    "/api/v1/projects/{project}/users/{name}/totp",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
)
def disable_totp(project: str, name: str, db: DbDep, principal: PrincipalDep) -> Response:
    """Sign-in without a TOTP code again."""
    _managed(
        project, "token.manage", db, principal, lambda tx, p: sessions.disable_totp(tx, principal, p, name)
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/api/v1/projects/{project}/users/{name}/sessions", response_model=SessionPage)
def user_sessions(project: str, name: str, db: DbDep, principal: PrincipalDep) -> SessionPage:
    """The user's live console sessions, newest first."""
    found: list[sessions.Session] = _managed(
        project,
        "token.manage",
        db,
        principal,
        lambda tx, p: sessions.list_user_sessions(tx, principal, p, name),
        write=False,
    )
    return SessionPage(items=[_session_out(s) for s in found])


@router.post("/api/v1/projects/{project}/sessions/{session_id}/revoke", response_model=SessionOut)
def revoke_session(project: str, session_id: str, db: DbDep, principal: PrincipalDep) -> SessionOut:
    """Revoke a session of a user the caller manages in the project (or its own); idempotent."""
    revoked: sessions.Session = _managed(
        project,
        "token.manage",
        db,
        principal,
        lambda tx, p: sessions.revoke_session(tx, principal, p, session_id),
    )
    return _session_out(revoked)
