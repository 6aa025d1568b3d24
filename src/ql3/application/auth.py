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


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedToken:
    principal: Principal
    token: str
    project: Project
    role: str


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


def authenticate(tx: Transaction, token: str | None) -> Principal:
    """Map a presented bearer token to its principal by digest; constant-time confirm."""
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise Unauthenticated()
    digest = token_digest(API_TOKEN_DOMAIN, token)
    row = tx.one("principal_by_digest", {"token_digest": digest})
    if row is None or not digest_equals(row["token_digest"], digest):
        raise Unauthenticated()
    return Principal(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(row["created_at_ms"]),
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
    tx: Transaction, *, name: str, role: str, project: Project, kind: str = "user", owner: bool = False
) -> IssuedToken:
    """Create a principal with a fresh token; only the digest is stored, the token is returned once."""
    validate_name(name, "principal name")
    if role not in ROLES:
        raise ValidationFailed("invalid role", field="role")
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
        },
    )
    tx.run("binding_upsert", {"principal_id": principal.id, "project_id": project.id, "role": role})
    tx.run("project_bump_version", {"id": project.id})
    return IssuedToken(principal=principal, token=token, project=project, role=role)


def bootstrap_owner(tx: Transaction) -> IssuedToken | None:
    """First start: create the default project and the owner. Returns None when already done."""
    if int((tx.one("principal_count_owners") or {"n": 0})["n"]) > 0:
        return None
    tx.run("project_insert", {"id": new_id(), "name": DEFAULT_PROJECT, "now": tx.now_ms()})
    project = resolve_project(tx, DEFAULT_PROJECT)
    return issue_token(tx, name="owner", role="admin", project=project, owner=True)
