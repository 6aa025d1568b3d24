"""Principals, bearer tokens (stored as digests only) and project-scoped roles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.application import rows
from ql3.domain.auth import ROLES, role_allows
from ql3.domain.digests import API_TOKEN_DOMAIN, digest_equals, new_token, token_digest
from ql3.domain.errors import Conflict, NotFound, PermissionDenied, Unauthenticated, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Principal, Project
from ql3.domain.tasks import validate_name
from ql3.ports.storage import Transaction

TOKEN_PREFIX: Final = "ql3_"
DEFAULT_PROJECT: Final = "default"
MAX_TOKEN_LENGTH: Final = 256
# ``expires_in_s`` of a new or rotated token: one minute to ten years.
MIN_EXPIRES_IN_S: Final = 60
MAX_EXPIRES_IN_S: Final = 10 * 366 * 86400
# last_used_at_ms is written at most once a minute per principal, so reads stay reads.
LAST_USED_GRANULARITY_MS: Final = 60_000
MAX_TOKEN_PAGE: Final = 500
MAX_BINDINGS: Final = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedToken:
    principal: Principal
    token: str
    project: Project
    role: str
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """A principal as its project's admins see it: never its token or the token's digest."""

    id: str
    name: str
    role: str
    is_owner: bool
    created_at_ms: int
    expires_at_ms: int | None
    revoked_at_ms: int | None
    last_used_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Authenticated:
    principal: Principal
    needs_touch: bool  # last_used_at_ms is older than the granularity: record this use


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _record(row: dict[str, object]) -> TokenRecord:
    return TokenRecord(
        id=str(row["id"]),
        name=str(row["name"]),
        role=str(row["role"]),
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(str(row["created_at_ms"])),
        expires_at_ms=_opt_int(row["expires_at_ms"]),
        revoked_at_ms=_opt_int(row["revoked_at_ms"]),
        last_used_at_ms=_opt_int(row["last_used_at_ms"]),
    )


def validate_expires_in(expires_in_s: object) -> int | None:
    if expires_in_s is None:
        return None
    if (
        isinstance(expires_in_s, bool)
        or not isinstance(expires_in_s, int)
        or not MIN_EXPIRES_IN_S <= expires_in_s <= MAX_EXPIRES_IN_S
    ):
        raise ValidationFailed("invalid expires_in_s", field="expires_in_s")
    return expires_in_s


def resolve_project(tx: Transaction, ref: str) -> Project:
    if not isinstance(ref, str) or not ref or len(ref) > 128:
        raise NotFound("project not found")
    row = tx.one("project_get", {"ref": ref})
    if row is None:
        raise NotFound("project not found")
    return rows.project(row)


def create_project(tx: Transaction, name: str) -> Project:
    validate_name(name, "project name")
    if tx.run("project_insert", {"id": new_id(), "name": name, "now": tx.now_ms()}) != 1:
        raise Conflict("a project with that name exists", code_hint="name_taken")
    return resolve_project(tx, name)


def authenticate_use(tx: Transaction, token: str | None) -> Authenticated:
    """Map a presented bearer token to its principal by digest; constant-time confirm.

    Revoked and expired tokens are refused here, on every request: nothing is cached.
    """
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise Unauthenticated()
    digest = token_digest(API_TOKEN_DOMAIN, token)
    row = tx.one("principal_by_digest", {"token_digest": digest})
    if row is None or not digest_equals(row["token_digest"], digest):
        raise Unauthenticated()
    now = tx.now_ms()
    if row["expires_at_ms"] is not None and int(row["expires_at_ms"]) <= now:
        raise Unauthenticated()
    last_used = row["last_used_at_ms"]
    principal = Principal(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(row["created_at_ms"]),
    )
    stale = last_used is None or int(last_used) < now - LAST_USED_GRANULARITY_MS
    return Authenticated(principal=principal, needs_touch=stale)


def authenticate(tx: Transaction, token: str | None) -> Principal:
    return authenticate_use(tx, token).principal


def touch(tx: Transaction, principal_id: str) -> None:
    """Record a use of the principal's token (at most once per granularity window)."""
    now = tx.now_ms()
    tx.run(
        "principal_touch", {"id": principal_id, "now": now, "stale_before": now - LAST_USED_GRANULARITY_MS}
    )


def role_in(tx: Transaction, principal: Principal, project: Project) -> str | None:
    if principal.is_owner:
        return "admin"
    row = tx.one("binding_get", {"principal_id": principal.id, "project_id": project.id})
    return str(row["role"]) if row else None


def authorize(tx: Transaction, principal: Principal, project_ref: str, permission: str) -> Project:
    """Resolve the project and require ``permission`` there.

    A principal with no role in the project gets ``not_found`` (it may not learn the project exists);
    one whose role lacks the permission gets ``permission_denied``.
    """
    project = resolve_project(tx, project_ref)
    role = role_in(tx, principal, project)
    if role is None:
        raise NotFound("project not found")
    if not role_allows(role, permission):
        raise PermissionDenied(permission=permission)
    return project


def issue_token(
    tx: Transaction,
    *,
    name: str,
    role: str,
    project: Project,
    kind: str = "user",
    owner: bool = False,
    expires_in_s: int | None = None,
) -> IssuedToken:
    """Create a principal with a fresh token; only the digest is stored, the token is returned once."""
    validate_name(name, "principal name")
    if role not in ROLES:
        raise ValidationFailed("invalid role", field="role")
    lifetime_s = validate_expires_in(expires_in_s)
    expires_at_ms = None if lifetime_s is None else tx.now_ms() + lifetime_s * 1000
    token = new_token(TOKEN_PREFIX)
    principal = Principal(id=new_id(), name=name, kind=kind, is_owner=owner, created_at_ms=tx.now_ms())
    tx.run(
        "principal_insert",
        {
            "id": principal.id,
            "name": name,
            "kind": kind,
            "is_owner": int(owner),
            "token_digest": token_digest(API_TOKEN_DOMAIN, token),
            "now": tx.now_ms(),
            "expires_at_ms": expires_at_ms,
        },
    )
    tx.run("binding_upsert", {"principal_id": principal.id, "project_id": project.id, "role": role})
    tx.run("project_bump_version", {"id": project.id})
    return IssuedToken(
        principal=principal, token=token, project=project, role=role, expires_at_ms=expires_at_ms
    )


# -- the lifecycle of tokens: list, revoke, rotate (docs/security.md "Tokens") -------------------------


def list_tokens(tx: Transaction, project: Project, *, after: str = "", limit: int = 100) -> list[TokenRecord]:
    """The principals bound to ``project`` (revoked ones too, with their revocation time), by id."""
    page = max(1, min(limit, MAX_TOKEN_PAGE))
    rows = tx.all("token_list", {"project_id": project.id, "after": after, "limit": page})
    return [_record(row) for row in rows]


def _managed_token(
    tx: Transaction, caller: Principal, project: Project, principal_id: str
) -> dict[str, object]:
    """The target principal, if ``caller`` may manage it.

    Only the owner manages the owner; anyone else is managed by a caller who is admin in every
    project the target holds a role in (so no admin can take over a role they do not hold).
    """
    if not isinstance(principal_id, str) or not principal_id or len(principal_id) > 128:
        raise NotFound("token not found")
    row = tx.one("token_get", {"project_id": project.id, "id": principal_id})
    if row is None:
        raise NotFound("token not found")
    if caller.is_owner:
        return row
    if bool(row["is_owner"]):
        raise PermissionDenied(permission="token.manage_owner")
    for binding in tx.all("principal_bindings", {"principal_id": principal_id, "limit": MAX_BINDINGS}):
        other = Project(
            id=str(binding["project_id"]), name=str(binding["project_name"]), version=1, created_at_ms=0
        )
        if role_in(tx, caller, other) != "admin":
            raise PermissionDenied(permission="token.manage")
    return row


def revoke_token(tx: Transaction, caller: Principal, project: Project, principal_id: str) -> TokenRecord:
    """Disable the principal: its token is refused from the next request on. Idempotent.

    The owner cannot be revoked (that would lock every admin out of the server); rotate it instead.
    """
    row = _managed_token(tx, caller, project, principal_id)
    if bool(row["is_owner"]):
        raise Conflict(
            "the owner cannot be revoked; rotate its token instead", code_hint="owner_not_revocable"
        )
    if tx.run("principal_revoke", {"id": principal_id, "now": tx.now_ms()}) == 1:
        tx.run("project_bump_version", {"id": project.id})
    again = tx.one("token_get", {"project_id": project.id, "id": principal_id})
    assert again is not None
    return _record(again)


@dataclass(frozen=True, slots=True, kw_only=True)
class RotatedToken:
    record: TokenRecord
    token: str


def rotate_token(
    tx: Transaction,
    caller: Principal,
    project: Project,
    principal_id: str,
    *,
    expires_in_s: int | None = None,
) -> RotatedToken:
    """Replace the principal's token: the old one is refused at once, the new one is returned once.

    Without ``expires_in_s`` a token that had a lifetime gets the same lifetime again from now; one
    without expiry stays without.
    """
    lifetime_s = validate_expires_in(expires_in_s)
    row = _managed_token(tx, caller, project, principal_id)
    if row["revoked_at_ms"] is not None:
        raise Conflict("the token is revoked", code_hint="token_revoked")
    now = tx.now_ms()
    if lifetime_s is not None:
        expires_at_ms: int | None = now + lifetime_s * 1000
    elif row["expires_at_ms"] is not None:
        issued = int(str(row["token_issued_at_ms"] or row["created_at_ms"]))
        expires_at_ms = now + max(MIN_EXPIRES_IN_S * 1000, int(str(row["expires_at_ms"])) - issued)
    else:
        expires_at_ms = None
    token = new_token(TOKEN_PREFIX)
    changed = tx.run(
        "principal_rotate",
        {
            "id": principal_id,
            "token_digest": token_digest(API_TOKEN_DOMAIN, token),
            "now": now,
            "expires_at_ms": expires_at_ms,
        },
    )
    if changed != 1:
        raise Conflict("the token is revoked", code_hint="token_revoked")
    tx.run("project_bump_version", {"id": project.id})
    again = tx.one("token_get", {"project_id": project.id, "id": principal_id})
    assert again is not None
    return RotatedToken(record=_record(again), token=token)


def task_digest_key(tx: Transaction) -> bytes:
    """The database's key of task content digests (created by migration 0006, never shown)."""
    row = tx.one("server_key_get", {"name": "task_digest"})
    if row is None:
        raise Conflict("the task digest key is missing; run ql3 db migrate", code_hint="schema_outdated")
    return bytes.fromhex(str(row["key_hex"]))


def roles_of(tx: Transaction, principal: Principal) -> dict[str, str]:
    """Project name -> role for ``whoami``; the owner is admin in every project."""
    if principal.is_owner:
        projects = tx.all("project_list", {"after": "", "limit": MAX_BINDINGS})
        return {str(p["name"]): "admin" for p in projects}
    rows = tx.all("principal_bindings", {"principal_id": principal.id, "limit": MAX_BINDINGS})
    return {str(r["project_name"]): str(r["role"]) for r in rows}


def bootstrap_owner(tx: Transaction) -> IssuedToken | None:
    """First start: create the default project and the owner. Returns None when already done."""
    if int((tx.one("principal_count_owners") or {"n": 0})["n"]) > 0:
        return None
    tx.run("project_insert", {"id": new_id(), "name": DEFAULT_PROJECT, "now": tx.now_ms()})
    project = resolve_project(tx, DEFAULT_PROJECT)
    return issue_token(tx, name="owner", role="admin", project=project, owner=True)
