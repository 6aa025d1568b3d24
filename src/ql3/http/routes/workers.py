"""Workers: the registry as seen from a project, and drain.

Workers are shared by every project: any member with ``worker.read`` sees them (never a session id,
token or capability hash). Draining affects every project, so it needs the owner or an admin of the
default project.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ql3.application import auth, workers
from ql3.domain.auth import role_allows
from ql3.domain.errors import NotFound, PermissionDenied
from ql3.domain.model import Principal
from ql3.domain.workers import WORKER_ID_RE
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import WorkerOut, WorkerPage
from ql3.ports.storage import Transaction

router = APIRouter(tags=["workers"])


@router.get("/api/v1/projects/{project}/workers", response_model=WorkerPage)
def list_workers(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    after: Annotated[str, Query(max_length=128, description="the last worker id of the previous page")] = "",
    limit: Annotated[int, Query(ge=1, le=workers.MAX_WORKER_PAGE)] = workers.MAX_WORKER_PAGE,
) -> WorkerPage:
    """Every registered worker by id; ``status`` is ``expired`` when its session lease ran out."""

    def unit(tx: Transaction) -> WorkerPage:
        auth.authorize(tx, principal, project, "worker.read")
        page = workers.list_workers(tx, after=after, limit=limit)
        next_after = str(page[-1]["id"]) if len(page) == limit else None
        return WorkerPage(items=[WorkerOut(**w) for w in page], next_after=next_after)

    return db.transaction(unit, write=False)


def _require_manage(tx: Transaction, principal: Principal) -> None:
    if principal.is_owner:
        return
    try:
        project = auth.resolve_project(tx, auth.DEFAULT_PROJECT)
    except NotFound:
        raise PermissionDenied(permission="worker.manage") from None
    role = auth.role_in(tx, principal, project)
    if role is None or not role_allows(role, "worker.manage"):
        raise PermissionDenied(permission="worker.manage")


@router.get("/api/v1/projects/{project}/workers/{worker_id}", response_model=WorkerOut)
def show_worker(project: str, worker_id: str, db: DbDep, principal: PrincipalDep) -> WorkerOut:
    """One registered worker: labels, slots and busy slots, status and heartbeat."""

    def unit(tx: Transaction) -> WorkerOut:
        auth.authorize(tx, principal, project, "worker.read")
        if not WORKER_ID_RE.fullmatch(worker_id):
            raise NotFound("worker not found")
        return WorkerOut(**workers.show_worker(tx, worker_id))

    return db.transaction(unit, write=False)


@router.post("/api/v1/workers/{worker_id}/drain", response_model=WorkerOut)
def drain_worker(worker_id: str, db: DbDep, principal: PrincipalDep) -> WorkerOut:
    """Stop giving the worker new runs; the runs it has go on. Owner or admin of ``default`` only."""

    def unit(tx: Transaction) -> WorkerOut:
        _require_manage(tx, principal)
        if not WORKER_ID_RE.fullmatch(worker_id):
            raise NotFound("worker not found")
        workers.drain(tx, worker_id)
        return WorkerOut(**workers.show_worker(tx, worker_id))

    return db.transaction(unit)
