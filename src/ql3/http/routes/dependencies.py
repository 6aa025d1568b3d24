"""A project's dependencies: list (``task.read``), add, remove and install again (admin).

Each change queues a run of the project's ``ql3-deps`` task that installs the whole set; the response
names it so a client can follow its log (docs/dependencies.md).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, status
from pydantic import BaseModel, Field

from ql3.application import auth, dependencies
from ql3.application.dependencies import Change
from ql3.domain.dependencies import INSTALL_TASK
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/dependencies", tags=["dependencies"])
ADMIN = "project.admin"


class DependencyIn(Body):
    kind: Literal["python", "node"]
    spec: str = Field(
        min_length=1, max_length=200, description="requests==2.32.* (PEP 508) or axios@^1.7 (npm)"
    )


class DependencyOut(BaseModel):
    kind: str
    name: str
    spec: str
    created_at_ms: int
    updated_at_ms: int


class DependencyList(BaseModel):
    items: list[DependencyOut]
    install_task: str


class ChangeOut(BaseModel):
    kind: str
    name: str
    spec: str
    run_id: str | None = Field(description="the install run queued by this change; null: nothing changed")


class InstallOut(BaseModel):
    run_id: str


def _change(change: Change) -> ChangeOut:
    d = change.dependency
    return ChangeOut(
        kind=d.kind, name=d.name, spec=d.spec, run_id=None if change.run is None else change.run.id
    )


@router.get("", response_model=DependencyList)
def list_dependencies(project: str, db: DbDep, principal: PrincipalDep) -> DependencyList:
    def unit(tx: Transaction) -> DependencyList:
        found = auth.authorize(tx, principal, project, "task.read")
        items = [
            DependencyOut(
                kind=d.kind,
                name=d.name,
                spec=d.spec,
                created_at_ms=d.created_at_ms,
                updated_at_ms=d.updated_at_ms,
            )
            for d in dependencies.list_set(tx, found)
        ]
        return DependencyList(items=items, install_task=INSTALL_TASK)

    return db.transaction(unit, write=False)


@router.post("", response_model=ChangeOut, status_code=status.HTTP_201_CREATED)
def add_dependency(project: str, body: DependencyIn, db: DbDep, principal: PrincipalDep) -> ChangeOut:
    """Add a dependency (or change the version of one already there) and queue the install run.
    422: a spec that is not a PEP 508 requirement (python) or an npm name and range (node)."""

    def unit(tx: Transaction) -> ChangeOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        return _change(dependencies.add(tx, found, principal, body.kind, body.spec))

    return db.transaction(unit)


@router.delete("/{kind}/{name:path}", response_model=ChangeOut)
def remove_dependency(
    project: str, kind: Literal["python", "node"], name: str, db: DbDep, principal: PrincipalDep
) -> ChangeOut:
    """Remove a dependency by kind and name and queue the install run of the remaining set.
    422: a name that is not a PEP 508 name (python) or an npm name (node)."""

    def unit(tx: Transaction) -> ChangeOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        return _change(dependencies.remove(tx, found, principal, kind, name))

    return db.transaction(unit)


@router.post("/install", response_model=InstallOut, status_code=status.HTTP_202_ACCEPTED)
def install(project: str, db: DbDep, principal: PrincipalDep) -> InstallOut:
    """Install the current set again, e.g. after a failed install run."""

    def unit(tx: Transaction) -> InstallOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        return InstallOut(run_id=dependencies.install_now(tx, found, principal).id)

    return db.transaction(unit)
