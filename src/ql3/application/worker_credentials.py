"""Worker credentials: a bearer token bound to one worker id, stored as a digest, revocable.

A worker credential is a principal of kind ``worker`` whose name is the worker id. It has no role in
any project, so the management API refuses it (docs/security.md); the worker API accepts nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ql3.application import worker_labels
from ql3.application.auth import TOKEN_PREFIX, validate_expires_in
from ql3.domain.digests import API_TOKEN_DOMAIN, new_token, token_digest
from ql3.domain.errors import Conflict, NotFound, PermissionDenied
from ql3.domain.ids import new_id
from ql3.domain.model import Principal
from ql3.domain.workers import validate_worker_id
from ql3.ports.storage import Transaction
from ql3.repositories import auth as auth_store
from ql3.repositories.auth import WorkerToken as WorkerToken

MAX_PAGE: Final = 200


class WorkerTokenExists(Conflict):
    """That worker id already has an active credential; revoke it first."""

    code = "worker_token_exists"


class NotAWorker(PermissionDenied):
    """The worker API needs a worker credential (ql3 worker token create)."""

    code = "worker_credential_required"


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedWorkerToken:
    record: WorkerToken
    token: str


def issue(
    tx: Transaction,
    worker_id: str,
    *,
    expires_in_s: int | None = None,
    labels: Mapping[str, str] | None = None,
    issued_by: str | None = None,
) -> IssuedWorkerToken:
    """A fresh credential for ``worker_id``; only its digest is stored, the token is returned once.
    With ``labels`` (and ``issued_by``, the admin's principal id) those become the labels the worker
    id may register with (application/worker_labels.py); without, the ones bound before stay."""
    validate_worker_id(worker_id)
    lifetime_s = validate_expires_in(expires_in_s)
    if labels is not None:
        if issued_by is None:
            raise ValueError("labels need the principal that approves them")
        checked = worker_labels.checked_labels(dict(labels))
    if auth_store.get_active_worker_token(tx, worker_id) is not None:
        raise WorkerTokenExists(worker_id=worker_id)
    now = tx.now_ms()
    token = new_token(TOKEN_PREFIX)
    principal = Principal(id=new_id(), name=worker_id, kind="worker", is_owner=False, created_at_ms=now)
    auth_store.insert_principal(
        tx,
        principal,
        token_digest=token_digest(API_TOKEN_DOMAIN, token),
        expires_at_ms=None if lifetime_s is None else now + lifetime_s * 1000,
    )
    if labels is not None and issued_by is not None:
        worker_labels.approve(tx, worker_id, checked, approved_by=issued_by)
    return IssuedWorkerToken(record=_written(tx, principal.id), token=token)


def _written(tx: Transaction, token_id: str) -> WorkerToken:
    """The credential as this transaction just wrote it."""
    found = auth_store.get_worker_token(tx, token_id)
    assert found is not None
    return found


def list_page(tx: Transaction, *, after: str = "", limit: int = MAX_PAGE) -> list[WorkerToken]:
    page = max(1, min(limit, MAX_PAGE))
    return auth_store.list_worker_tokens(tx, after=after, limit=page)


def revoke(tx: Transaction, token_id: str) -> WorkerToken:
    """Refused from the next request on; idempotent."""
    if not isinstance(token_id, str) or not 1 <= len(token_id) <= 128:
        raise NotFound("worker token not found")
    if auth_store.get_worker_token(tx, token_id) is None:
        raise NotFound("worker token not found")
    auth_store.revoke_principal(tx, token_id)
    return _written(tx, token_id)


def worker_id_of(principal: Principal) -> str:
    """The one worker id a credential may act for; anything but a worker credential is refused."""
    if principal.kind != "worker":
        raise NotAWorker()
    return validate_worker_id(principal.name)
