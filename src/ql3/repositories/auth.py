"""Principals, their token digests, their roles in projects, worker credentials and server keys.

Tokens themselves are never stored: only their digests (``domain/digests.py``), which never leave
this module except to be compared in constant time by ``application/auth.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ql3.domain.auth import PRINCIPAL_KINDS, ROLES, Role
from ql3.domain.model import Principal, RoleBinding
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of, opt_int

# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Credential:
    """A live principal found by its token digest, with what authentication checks on every use."""

    principal: Principal
    token_digest: str
    expires_at_ms: int | None
    last_used_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """A principal as its project's admins see it: never its token or the token's digest."""

    id: str
    name: str
    role: Role
    is_owner: bool
    created_at_ms: int
    expires_at_ms: int | None
    revoked_at_ms: int | None
    last_used_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagedToken:
    """A project's token as its management reads it: the record plus when its token was issued."""

    record: TokenRecord
    token_issued_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectRole:
    """One role binding of a principal, with the project's name."""

    project_id: str
    project_name: str
    role: Role


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerToken:
    """A worker credential: a principal of kind ``worker`` whose name is the worker id."""

    id: str
    worker_id: str
    created_at_ms: int
    expires_at_ms: int | None
    revoked_at_ms: int | None
    last_used_at_ms: int | None


def principal_from_row(row: Row) -> Principal:
    return Principal(
        id=row["id"],
        name=row["name"],
        kind=one_of(row["kind"], PRINCIPAL_KINDS, "principals.kind"),
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(row["created_at_ms"]),
    )


def _token_record(row: Row) -> TokenRecord:
    return TokenRecord(
        id=str(row["id"]),
        name=str(row["name"]),
        role=one_of(row["role"], ROLES, "role_bindings.role"),
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(str(row["created_at_ms"])),
        expires_at_ms=opt_int(row["expires_at_ms"]),
        revoked_at_ms=opt_int(row["revoked_at_ms"]),
        last_used_at_ms=opt_int(row["last_used_at_ms"]),
    )


def _worker_token(row: Row) -> WorkerToken:
    return WorkerToken(
        id=str(row["id"]),
        worker_id=str(row["name"]),
        created_at_ms=int(row["created_at_ms"]),
        expires_at_ms=opt_int(row["expires_at_ms"]),
        revoked_at_ms=opt_int(row.get("revoked_at_ms")),  # the active-credential query omits it
        last_used_at_ms=opt_int(row["last_used_at_ms"]),
    )


# -- principals ---------------------------------------------------------------------------------


def get_credential(tx: Transaction, token_digest: str) -> Credential | None:
    """The principal holding the token with this digest, unless it is revoked."""
    row = tx.one("principal_by_digest", {"token_digest": token_digest})
    if row is None:
        return None
    return Credential(
        principal=principal_from_row(row),
        token_digest=str(row["token_digest"]),
        expires_at_ms=opt_int(row["expires_at_ms"]),
        last_used_at_ms=opt_int(row["last_used_at_ms"]),
    )


def get_live_principal(tx: Transaction, principal_id: str) -> Principal | None:
    """The principal with this id, unless it is revoked or its token has expired."""
    row = tx.one("approval_principal_get", {"id": principal_id})
    if row is None or row["disabled_at_ms"] is not None:
        return None
    if row["expires_at_ms"] is not None and int(row["expires_at_ms"]) <= tx.now_ms():
        return None
    return principal_from_row(row)


def get_issuer(tx: Transaction, principal_id: str) -> str | None:
    """Who issued the principal's current token (None: the server itself, unknown, or no principal)."""
    row = tx.one("principal_issuer", {"id": principal_id})
    return None if row is None or row["issued_by"] is None else str(row["issued_by"])


def insert_principal(
    tx: Transaction,
    principal: Principal,
    *,
    token_digest: str,
    expires_at_ms: int | None,
    issued_by: str | None = None,
) -> None:
    """A new principal whose token is issued at its creation time, by ``issued_by`` (None: the server)."""
    tx.run(
        "principal_insert",
        {
            "id": principal.id,
            "name": principal.name,
            "kind": principal.kind,
            "is_owner": int(principal.is_owner),
            "token_digest": token_digest,
            "now": principal.created_at_ms,
            "expires_at_ms": expires_at_ms,
            "issued_by": issued_by,
        },
    )


def touch_principal(tx: Transaction, principal_id: str, *, stale_before_ms: int) -> None:
    """Record a use now, unless one was recorded at or after ``stale_before_ms``."""
    tx.run("principal_touch", {"id": principal_id, "now": tx.now_ms(), "stale_before": stale_before_ms})


def revoke_principal(tx: Transaction, principal_id: str) -> bool:
    """Disable the principal now; False when it already was."""
    return tx.run("principal_revoke", {"id": principal_id, "now": tx.now_ms()}) == 1


def rotate_principal_token(
    tx: Transaction, principal_id: str, *, token_digest: str, expires_at_ms: int | None, issued_by: str
) -> bool:
    """Replace the token digest of a live principal (issued now by ``issued_by``, who then holds it);
    False when it is revoked."""
    params = {
        "id": principal_id,
        "token_digest": token_digest,
        "expires_at_ms": expires_at_ms,
        "issued_by": issued_by,
    }
    return tx.run("principal_rotate", {**params, "now": tx.now_ms()}) == 1


def take_bootstrap_lock(tx: Transaction) -> None:
    """Serialise first starts until this transaction ends (PostgreSQL: a transaction-scoped advisory
    lock; SQLite's write lock already serialises them)."""
    tx.one("cluster_bootstrap_lock")


def count_owners(tx: Transaction) -> int:
    row = tx.one("principal_count_owners")
    return 0 if row is None else int(row["n"])


# -- roles --------------------------------------------------------------------------------------


def get_binding(tx: Transaction, principal_id: str, project_id: str) -> RoleBinding | None:
    row = tx.one("binding_get", {"principal_id": principal_id, "project_id": project_id})
    if row is None:
        return None
    return RoleBinding(
        principal_id=str(row["principal_id"]),
        project_id=str(row["project_id"]),
        role=one_of(row["role"], ROLES, "role_bindings.role"),
        version=int(row["version"]),
    )


def upsert_binding(tx: Transaction, *, principal_id: str, project_id: str, role: Role) -> None:
    """Give the principal ``role`` in the project (a changed role moves the binding's version)."""
    tx.run("binding_upsert", {"principal_id": principal_id, "project_id": project_id, "role": role})


def list_roles_of(tx: Transaction, principal_id: str, *, limit: int) -> list[ProjectRole]:
    """The principal's role bindings, by project name."""
    found = tx.all("principal_bindings", {"principal_id": principal_id, "limit": limit})
    return [
        ProjectRole(
            project_id=str(row["project_id"]),
            project_name=str(row["project_name"]),
            role=one_of(row["role"], ROLES, "role_bindings.role"),
        )
        for row in found
    ]


# -- the tokens of a project --------------------------------------------------------------------


def list_project_tokens(tx: Transaction, *, project_id: str, after: str, limit: int) -> list[TokenRecord]:
    """The principals bound to the project (revoked ones too), by id after ``after``."""
    found = tx.all("token_list", {"project_id": project_id, "after": after, "limit": limit})
    return [_token_record(row) for row in found]


def get_project_token(tx: Transaction, *, project_id: str, principal_id: str) -> ManagedToken | None:
    """The principal if it has a role in the project."""
    row = tx.one("token_get", {"project_id": project_id, "id": principal_id})
    if row is None:
        return None
    return ManagedToken(record=_token_record(row), token_issued_at_ms=opt_int(row["token_issued_at_ms"]))


# -- worker credentials -------------------------------------------------------------------------


def get_active_worker_token(tx: Transaction, worker_id: str) -> WorkerToken | None:
    """The worker id's credential that is not revoked (there is at most one)."""
    row = tx.one("worker_principal_active", {"name": worker_id})
    return None if row is None else _worker_token(row)


def get_worker_token(tx: Transaction, token_id: str) -> WorkerToken | None:
    row = tx.one("worker_principal_get", {"id": token_id})
    return None if row is None else _worker_token(row)


def list_worker_tokens(tx: Transaction, *, after: str, limit: int) -> list[WorkerToken]:
    """Worker credentials (revoked ones too), by id after ``after``."""
    return [_worker_token(row) for row in tx.all("worker_principal_list", {"after": after, "limit": limit})]


# -- server keys --------------------------------------------------------------------------------


def get_server_key(tx: Transaction, name: str) -> bytes | None:
    """A secret key the database holds for the server (never shown)."""
    row = tx.one("server_key_get", {"name": name})
    return None if row is None else bytes.fromhex(str(row["key_hex"]))
