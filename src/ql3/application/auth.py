"""Principals, bearer tokens (stored as digests only) and project-scoped roles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.auth import PrincipalKind, Role, as_role, role_allows
from ql3.domain.digests import API_TOKEN_DOMAIN, digest_equals, new_token, token_digest
from ql3.domain.errors import Conflict, NotFound, PermissionDenied, Unauthenticated, ValidationFailed
from ql3.domain.ids import is_id, new_id
from ql3.domain.model import Principal, Project, Task, TaskRevision
from ql3.domain.tasks import validate_name
from ql3.ports.storage import Transaction
from ql3.repositories import auth as auth_store
from ql3.repositories import projects as project_store
from ql3.repositories import tasks as task_store
from ql3.repositories.auth import TokenRecord as TokenRecord

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
class Authenticated:
    principal: Principal
    needs_touch: bool  # last_used_at_ms is older than the granularity: record this use
    # When the credential stops being valid by its own expiry, and the time of this check (both
    # epoch ms, the transaction's clock): what a cache of this answer may not outlive.
    expires_at_ms: int | None = None
    checked_at_ms: int = 0


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
    found = project_store.get_project(tx, ref)
    if found is None:
        raise NotFound("project not found")
    return found


def visible_projects(
    tx: Transaction, principal: Principal, *, after: str, limit: int
) -> tuple[list[tuple[Project, Role]], str | None]:
    """One page of projects by name, with the principal's role, keeping those it holds a role in
    (the owner sees all), and the cursor of the next page.

    The cursor follows what was scanned, not what was shown, so a page is always bounded.
    """
    scanned = project_store.list_projects(tx, after=after, limit=limit)
    visible = [
        (project, role) for project in scanned if (role := role_in(tx, principal, project)) is not None
    ]
    return visible, scanned[-1].name if len(scanned) == limit else None


def create_project(tx: Transaction, name: str) -> Project:
    validate_name(name, "project name")
    if not project_store.insert_project(tx, project_id=new_id(), name=name):
        raise Conflict("a project with that name exists", code_hint="name_taken")
    return resolve_project(tx, name)


def authenticate_use(tx: Transaction, token: str | None) -> Authenticated:
    """Map a presented bearer token to its principal by digest; constant-time confirm.

    Revoked and expired tokens are refused here. The console's and the API's requests call this on
    every request; the worker API may keep the answer for at most a second
    (``cluster/auth_cache.py``, docs/cluster.md "Credentials").
    """
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise Unauthenticated()
    digest = token_digest(API_TOKEN_DOMAIN, token)
    found = auth_store.get_credential(tx, digest)
    if found is None or not digest_equals(found.token_digest, digest):
        raise Unauthenticated()
    now = tx.now_ms()
    if found.expires_at_ms is not None and found.expires_at_ms <= now:
        raise Unauthenticated()
    last_used = found.last_used_at_ms
    stale = last_used is None or last_used < now - LAST_USED_GRANULARITY_MS
    return Authenticated(
        principal=found.principal, needs_touch=stale, expires_at_ms=found.expires_at_ms, checked_at_ms=now
    )


def authenticate(tx: Transaction, token: str | None) -> Principal:
    return authenticate_use(tx, token).principal


def touch(tx: Transaction, principal_id: str) -> None:
    """Record a use of the principal's token (at most once per granularity window)."""
    auth_store.touch_principal(tx, principal_id, stale_before_ms=tx.now_ms() - LAST_USED_GRANULARITY_MS)


def role_in(tx: Transaction, principal: Principal, project: Project) -> Role | None:
    if principal.is_owner:
        return "admin"
    binding = auth_store.get_binding(tx, principal.id, project.id)
    return None if binding is None else binding.role


# How many role bindings of one scrape principal are read for /metrics.
MAX_METRICS_PROJECTS: Final = 1000


def metrics_projects(tx: Transaction, principal: Principal) -> frozenset[str] | None:
    """The names of the projects whose task names ``principal`` may see as /metrics label values
    (its roles that allow ``metrics.read``); None: every project (the owner)."""
    if principal.is_owner:
        return None
    bindings = auth_store.list_roles_of(tx, principal.id, limit=MAX_METRICS_PROJECTS)
    return frozenset(b.project_name for b in bindings if role_allows(b.role, "metrics.read"))


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


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskAccess:
    project: Project
    task: Task
    revision: TaskRevision | None  # the task's current revision; None when it is missing


def authorize_task(
    tx: Transaction, principal: Principal, project_ref: str, task_ref: str, permission: str
) -> TaskAccess:
    """``authorize``, then ``tasks.find_task`` and the task's current revision, in one read
    (``run_create_target``) instead of four, refused in the same order with the same errors."""
    if not isinstance(project_ref, str) or not project_ref or len(project_ref) > 128:
        raise NotFound("project not found")
    valid_task = isinstance(task_ref, str) and 0 < len(task_ref) <= 128
    found = task_store.get_run_create_target(
        tx,
        principal_id=principal.id,
        project_ref=project_ref,
        task_ref=task_ref if valid_task else "",
        task_id=task_ref if valid_task and is_id(task_ref) else None,
    )
    if found is None:
        raise NotFound("project not found")
    role = "admin" if principal.is_owner else found.role
    if role is None:
        raise NotFound("project not found")
    if not role_allows(role, permission):
        raise PermissionDenied(permission=permission)
    if not valid_task or found.task is None:
        raise NotFound("task not found")
    return TaskAccess(project=found.project, task=found.task, revision=found.revision)


def issue_token(
    tx: Transaction,
    *,
    name: str,
    role: str,
    project: Project,
    kind: PrincipalKind = "user",
    owner: bool = False,
    expires_in_s: int | None = None,
    issued_by: Principal | None = None,
) -> IssuedToken:
    """Create a principal with a fresh token; only the digest is stored, the token is returned once.
    ``issued_by``: the caller who receives it (recorded for the separation of duty of approvals; None:
    the server itself)."""
    validate_name(name, "principal name")
    granted = as_role(role)
    if granted is None:
        raise ValidationFailed("invalid role", field="role")
    lifetime_s = validate_expires_in(expires_in_s)
    expires_at_ms = None if lifetime_s is None else tx.now_ms() + lifetime_s * 1000
    token = new_token(TOKEN_PREFIX)
    principal = Principal(id=new_id(), name=name, kind=kind, is_owner=owner, created_at_ms=tx.now_ms())
    auth_store.insert_principal(
        tx,
        principal,
        token_digest=token_digest(API_TOKEN_DOMAIN, token),
        expires_at_ms=expires_at_ms,
        issued_by=None if issued_by is None else issued_by.id,
    )
    auth_store.upsert_binding(tx, principal_id=principal.id, project_id=project.id, role=granted)
    project_store.bump_project_version(tx, project.id)
    return IssuedToken(
        principal=principal, token=token, project=project, role=role, expires_at_ms=expires_at_ms
    )


# -- the lifecycle of tokens: list, revoke, rotate (docs/security.md "Tokens") -------------------------


def list_tokens(tx: Transaction, project: Project, *, after: str = "", limit: int = 100) -> list[TokenRecord]:
    """The principals bound to ``project`` (revoked ones too, with their revocation time), by id."""
    page = max(1, min(limit, MAX_TOKEN_PAGE))
    return auth_store.list_project_tokens(tx, project_id=project.id, after=after, limit=page)


def _managed_token(
    tx: Transaction, caller: Principal, project: Project, principal_id: str
) -> auth_store.ManagedToken:
    """The target principal, if ``caller`` may manage it.

    Only the owner manages the owner; anyone else is managed by a caller who is admin in every
    project the target holds a role in (so no admin can take over a role they do not hold).
    """
    if not isinstance(principal_id, str) or not principal_id or len(principal_id) > 128:
        raise NotFound("token not found")
    found = auth_store.get_project_token(tx, project_id=project.id, principal_id=principal_id)
    if found is None:
        raise NotFound("token not found")
    if caller.is_owner:
        return found
    if found.record.is_owner:
        raise PermissionDenied(permission="token.manage_owner")
    for binding in auth_store.list_roles_of(tx, principal_id, limit=MAX_BINDINGS):
        other = Project(id=binding.project_id, name=binding.project_name, version=1, created_at_ms=0)
        if role_in(tx, caller, other) != "admin":
            raise PermissionDenied(permission="token.manage")
    return found


def managed_principal(tx: Transaction, caller: Principal, project: Project, principal_id: str) -> TokenRecord:
    """The principal ``principal_id`` of ``project``, if ``caller`` may manage it (as its token's
    management requires: see ``_managed_token``); its sign-in name and sessions are managed the same way."""
    return _managed_token(tx, caller, project, principal_id).record


def revoke_token(tx: Transaction, caller: Principal, project: Project, principal_id: str) -> TokenRecord:
    """Disable the principal: its token is refused from the next request on. Idempotent.

    The owner cannot be revoked (that would lock every admin out of the server); rotate it instead.
    """
    managed = _managed_token(tx, caller, project, principal_id)
    if managed.record.is_owner:
        raise Conflict(
            "the owner cannot be revoked; rotate its token instead", code_hint="owner_not_revocable"
        )
    if auth_store.revoke_principal(tx, principal_id):
        project_store.bump_project_version(tx, project.id)
    return _reread(tx, project, principal_id)


def _reread(tx: Transaction, project: Project, principal_id: str) -> TokenRecord:
    """The token as this transaction just wrote it (it was read above, and rows are never deleted)."""
    again = auth_store.get_project_token(tx, project_id=project.id, principal_id=principal_id)
    assert again is not None
    return again.record


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
    managed = _managed_token(tx, caller, project, principal_id)
    current = managed.record
    if current.revoked_at_ms is not None:
        raise Conflict("the token is revoked", code_hint="token_revoked")
    now = tx.now_ms()
    if lifetime_s is not None:
        expires_at_ms: int | None = now + lifetime_s * 1000
    elif current.expires_at_ms is not None:
        issued = managed.token_issued_at_ms or current.created_at_ms
        expires_at_ms = now + max(MIN_EXPIRES_IN_S * 1000, current.expires_at_ms - issued)
    else:
        expires_at_ms = None
    token = new_token(TOKEN_PREFIX)
    digest = token_digest(API_TOKEN_DOMAIN, token)
    if not auth_store.rotate_principal_token(
        tx, principal_id, token_digest=digest, expires_at_ms=expires_at_ms, issued_by=caller.id
    ):
        raise Conflict("the token is revoked", code_hint="token_revoked")
    project_store.bump_project_version(tx, project.id)
    return RotatedToken(record=_reread(tx, project, principal_id), token=token)


def task_digest_key(tx: Transaction) -> bytes:
    """The database's key of task content digests (created by migration 0006, never shown)."""
    key = auth_store.get_server_key(tx, "task_digest")
    if key is None:
        raise Conflict("the task digest key is missing; run ql3 db migrate", code_hint="schema_outdated")
    return key


def roles_of(tx: Transaction, principal: Principal) -> dict[str, str]:
    """Project name -> role for ``whoami``; the owner is admin in every project."""
    if principal.is_owner:
        projects = project_store.list_projects(tx, after="", limit=MAX_BINDINGS)
        return {p.name: "admin" for p in projects}
    return {b.project_name: b.role for b in auth_store.list_roles_of(tx, principal.id, limit=MAX_BINDINGS)}


def bootstrap_owner(tx: Transaction) -> IssuedToken | None:
    """First start: create the default project and the owner. Returns None when already done."""
    if auth_store.count_owners(tx) > 0:
        return None
    project_store.insert_project(tx, project_id=new_id(), name=DEFAULT_PROJECT)
    project = resolve_project(tx, DEFAULT_PROJECT)
    return issue_token(tx, name="owner", role="admin", project=project, owner=True)


def bootstrap_cluster_owner(tx: Transaction) -> IssuedToken | None:
    """``bootstrap_owner`` for replicas that may all be starting for the first time: under the
    bootstrap lock, so concurrent first starts create one owner."""
    auth_store.take_bootstrap_lock(tx)
    return bootstrap_owner(tx)
