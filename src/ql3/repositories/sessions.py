"""Sign-in names (password hash, sealed TOTP secret, lock-out state) and console sessions as stored.

A session's secret never reaches the database: only its digest (``application/sessions.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ql3.domain.auth import PRINCIPAL_KINDS
from ql3.domain.model import Principal
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of, opt_int


@dataclass(frozen=True, slots=True, kw_only=True)
class Login:
    principal: Principal
    login: str
    password_hash: str = field(repr=False)
    totp_sealed: str | None = field(repr=False)
    totp_last_step: int | None
    failed_count: int
    locked_until_ms: int | None
    disabled_at_ms: int | None  # the principal's revocation
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    id: str
    principal_id: str
    secret_digest: str = field(repr=False)
    created_at_ms: int
    last_seen_at_ms: int
    idle_timeout_ms: int
    expires_at_ms: int
    revoked_at_ms: int | None
    client: str
    user_agent: str

    def ends_at_ms(self) -> int:
        """When the session stops being valid if not used again: the earlier of its idle and absolute end."""
        return min(self.expires_at_ms, self.last_seen_at_ms + self.idle_timeout_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionWithPrincipal:
    session: Session
    principal: Principal
    disabled_at_ms: int | None


def _principal(row: Row) -> Principal:
    return Principal(
        id=str(row["principal_id"]),
        name=str(row["name"]),
        kind=one_of(row["kind"], PRINCIPAL_KINDS, "principals.kind"),
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(row["principal_created_at_ms"]),
    )


def _login(row: Row) -> Login:
    return Login(
        principal=_principal(row),
        login=str(row["login"]),
        password_hash=str(row["password_hash"]),
        totp_sealed=None if row["totp_sealed"] is None else str(row["totp_sealed"]),
        totp_last_step=opt_int(row["totp_last_step"]),
        failed_count=int(row["failed_count"]),
        locked_until_ms=opt_int(row["locked_until_ms"]),
        disabled_at_ms=opt_int(row["disabled_at_ms"]),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


def _session(row: Row) -> Session:
    return Session(
        id=str(row["id"]),
        principal_id=str(row["principal_id"]),
        secret_digest=str(row["secret_digest"]),
        created_at_ms=int(row["created_at_ms"]),
        last_seen_at_ms=int(row["last_seen_at_ms"]),
        idle_timeout_ms=int(row["idle_timeout_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
        revoked_at_ms=opt_int(row["revoked_at_ms"]),
        client=str(row["client"]),
        user_agent=str(row["user_agent"]),
    )


# -- sign-in names ------------------------------------------------------------------------------


def get_login(tx: Transaction, login: str) -> Login | None:
    row = tx.one("login_by_name", {"login": login})
    return None if row is None else _login(row)


def get_login_of(tx: Transaction, principal_id: str) -> Login | None:
    row = tx.one("login_by_principal", {"principal_id": principal_id})
    return None if row is None else _login(row)


def insert_login(tx: Transaction, *, principal_id: str, login: str, password_hash: str) -> bool:
    """False when the name is taken or the principal already has a sign-in name."""
    params = {"principal_id": principal_id, "login": login, "password_hash": password_hash}
    return tx.run("login_insert", {**params, "now": tx.now_ms()}) == 1


def set_password(tx: Transaction, principal_id: str, password_hash: str) -> bool:
    params = {"principal_id": principal_id, "password_hash": password_hash, "now": tx.now_ms()}
    return tx.run("login_set_password", params) == 1


def set_totp(tx: Transaction, principal_id: str, totp_sealed: str | None) -> bool:
    params = {"principal_id": principal_id, "totp_sealed": totp_sealed, "now": tx.now_ms()}
    return tx.run("login_set_totp", params) == 1


def record_failure(tx: Transaction, principal_id: str, *, max_failures: int, lockout_ms: int) -> None:
    """Count one failed sign-in of the name; the ``max_failures``-th locks it for ``lockout_ms``."""
    now = tx.now_ms()
    tx.run(
        "login_record_failure",
        {
            "principal_id": principal_id,
            "now": now,
            "max_failures": max_failures,
            "lock_until": now + lockout_ms,
        },
    )


def record_success(tx: Transaction, principal_id: str, *, totp_step: int | None) -> None:
    tx.run("login_record_success", {"principal_id": principal_id, "totp_last_step": totp_step})


def delete_login(tx: Transaction, principal_id: str) -> bool:
    return tx.run("login_delete", {"principal_id": principal_id}) == 1


def list_project_logins(tx: Transaction, *, project_id: str, after: str, limit: int) -> list[Login]:
    rows = tx.all("login_list_project", {"project_id": project_id, "after": after, "limit": limit})
    return [_login(row) for row in rows]


# -- sessions -----------------------------------------------------------------------------------


def insert_session(
    tx: Transaction,
    *,
    session_id: str,
    principal_id: str,
    secret_digest: str,
    idle_timeout_ms: int,
    expires_at_ms: int,
    client: str,
    user_agent: str,
) -> None:
    tx.run(
        "session_insert",
        {
            "id": session_id,
            "principal_id": principal_id,
            "secret_digest": secret_digest,
            "now": tx.now_ms(),
            "idle_timeout_ms": idle_timeout_ms,
            "expires_at_ms": expires_at_ms,
            "client": client,
            "user_agent": user_agent,
        },
    )


def get_session_by_digest(tx: Transaction, secret_digest: str) -> SessionWithPrincipal | None:
    row = tx.one("session_by_digest", {"secret_digest": secret_digest})
    if row is None:
        return None
    return SessionWithPrincipal(
        session=_session(row), principal=_principal(row), disabled_at_ms=opt_int(row["disabled_at_ms"])
    )


def get_session(tx: Transaction, session_id: str) -> Session | None:
    row = tx.one("session_get", {"id": session_id})
    return None if row is None else _session(row)


def touch_session(tx: Transaction, session_id: str, *, stale_before_ms: int) -> bool:
    """Record a use now (moving the idle end), unless one was recorded at or after ``stale_before_ms``."""
    params = {"id": session_id, "now": tx.now_ms(), "stale_before": stale_before_ms}
    return tx.run("session_touch", params) == 1


def revoke_session(tx: Transaction, session_id: str) -> bool:
    return tx.run("session_revoke", {"id": session_id, "now": tx.now_ms()}) == 1


def revoke_sessions_of(tx: Transaction, principal_id: str) -> int:
    return tx.run("session_revoke_principal", {"principal_id": principal_id, "now": tx.now_ms()})


def list_sessions_of(tx: Transaction, principal_id: str, *, limit: int) -> list[Session]:
    """The principal's live sessions, newest first."""
    rows = tx.all(
        "session_list_principal", {"principal_id": principal_id, "now": tx.now_ms(), "limit": limit}
    )
    return [_session(row) for row in rows]


def prune_sessions_of(tx: Transaction, principal_id: str, *, before_ms: int) -> int:
    """Delete the principal's sessions that ended before ``before_ms`` (revoked or past their end)."""
    return tx.run("session_prune_principal", {"principal_id": principal_id, "before": before_ms})
