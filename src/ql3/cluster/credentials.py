"""Worker credentials: a bearer token bound to one worker id, stored as a digest, revocable.

A worker credential is a principal of kind ``worker`` whose name is the worker id. It has no role in
any project, so the management API refuses it (docs/security.md); the worker API accepts nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ql3.application.auth import TOKEN_PREFIX, validate_expires_in
from ql3.domain.digests import API_TOKEN_DOMAIN, new_token, token_digest
from ql3.domain.errors import Conflict, NotFound, PermissionDenied
from ql3.domain.ids import new_id
from ql3.domain.model import Principal
from ql3.domain.workers import validate_worker_id
from ql3.ports.storage import Row, Transaction

MAX_PAGE: Final = 200


class WorkerTokenExists(Conflict):
    """That worker id already has an active credential; revoke it first."""

    code = "worker_token_exists"


class NotAWorker(PermissionDenied):
    """The worker API needs a worker credential (ql3 worker token create)."""

    code = "worker_credential_required"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerToken:
    id: str
    worker_id: str
    created_at_ms: int
    expires_at_ms: int | None
    revoked_at_ms: int | None
    last_used_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedWorkerToken:
    record: WorkerToken
    token: str


def _opt(value: Any) -> int | None:
    return None if value is None else int(value)


def _record(row: Row) -> WorkerToken:
    return WorkerToken(
        id=str(row["id"]),
        worker_id=str(row["name"]),
        created_at_ms=int(row["created_at_ms"]),
        expires_at_ms=_opt(row["expires_at_ms"]),
        revoked_at_ms=_opt(row.get("revoked_at_ms")),
        last_used_at_ms=_opt(row["last_used_at_ms"]),
    )


def issue(tx: Transaction, worker_id: str, *, expires_in_s: int | None = None) -> IssuedWorkerToken:
    """A fresh credential for ``worker_id``; only its digest is stored, the token is returned once."""
    validate_worker_id(worker_id)
    lifetime_s = validate_expires_in(expires_in_s)
    if tx.one("worker_principal_active", {"name": worker_id}) is not None:
        raise WorkerTokenExists(worker_id=worker_id)
    now = tx.now_ms()
    token = new_token(TOKEN_PREFIX)
    principal_id = new_id()
    tx.run(
        "principal_insert",
        {
            "id": principal_id,
            "name": worker_id,
            "kind": "worker",
            "is_owner": 0,
            "token_digest": token_digest(API_TOKEN_DOMAIN, token),
            "now": now,
            "expires_at_ms": None if lifetime_s is None else now + lifetime_s * 1000,
        },
    )
    row = tx.one("worker_principal_get", {"id": principal_id})
    assert row is not None
    return IssuedWorkerToken(record=_record(row), token=token)


def list_page(tx: Transaction, *, after: str = "", limit: int = MAX_PAGE) -> list[WorkerToken]:
    page = max(1, min(limit, MAX_PAGE))
    return [_record(r) for r in tx.all("worker_principal_list", {"after": after, "limit": page})]


def revoke(tx: Transaction, token_id: str) -> WorkerToken:
    """Refused from the next request on; idempotent."""
    if not isinstance(token_id, str) or not 1 <= len(token_id) <= 128:
        raise NotFound("worker token not found")
    if tx.one("worker_principal_get", {"id": token_id}) is None:
        raise NotFound("worker token not found")
    tx.run("principal_revoke", {"id": token_id, "now": tx.now_ms()})
    row = tx.one("worker_principal_get", {"id": token_id})
    assert row is not None
    return _record(row)


def worker_id_of(principal: Principal) -> str:
    """The one worker id a credential may act for; anything but a worker credential is refused."""
    if principal.kind != "worker":
        raise NotAWorker()
    return validate_worker_id(principal.name)
