"""Projects and the tokens of their members."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, Field

from ql3.application import auth, project_settings
from ql3.domain.errors import PermissionDenied
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import (
    Body,
    ProjectCreate,
    ProjectOut,
    ProjectPage,
    TokenCreate,
    TokenOut,
    project_out,
    token_out,
)
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects", tags=["projects"])

MAX_PROJECT_PAGE = 200


@router.get("", response_model=ProjectPage)
def list_projects(
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PROJECT_PAGE)] = 50,
) -> ProjectPage:
    """Projects the caller holds a role in (the owner sees all), by name."""

    def unit(tx: Transaction) -> ProjectPage:
        visible, next_cursor = auth.visible_projects(tx, principal, after=cursor or "", limit=limit)
        items = [project_out(project, role) for project, role in visible]
        return ProjectPage(items=items, next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.post("", response_model=ProjectOut, status_code=status.HTTP_201_CREATED)
def create_project(body: ProjectCreate, db: DbDep, principal: PrincipalDep) -> ProjectOut:
    """Only the owner creates projects."""

    def unit(tx: Transaction) -> ProjectOut:
        if not principal.is_owner:
            raise PermissionDenied(permission="project.create")
        return project_out(auth.create_project(tx, body.name), "admin")

    return db.transaction(unit)


@router.get("/{project}", response_model=ProjectOut)
def show_project(project: str, db: DbDep, principal: PrincipalDep) -> ProjectOut:
    def unit(tx: Transaction) -> ProjectOut:
        found = auth.authorize(tx, principal, project, "task.read")
        return project_out(found, auth.role_in(tx, principal, found))

    return db.transaction(unit, write=False)


@router.post("/{project}/tokens", response_model=TokenOut, status_code=status.HTTP_201_CREATED)
def create_token(project: str, body: TokenCreate, db: DbDep, principal: PrincipalDep) -> TokenOut:
    """A new principal with ``role`` in this project. The token is in this response and nowhere else."""

    def unit(tx: Transaction) -> TokenOut:
        found = auth.authorize(tx, principal, project, "token.create")
        issued = auth.issue_token(
            tx,
            name=body.name,
            role=body.role,
            project=found,
            expires_in_s=body.expires_in_s,
            issued_by=principal,
        )
        return token_out(issued)

    return db.transaction(unit)


class ProjectSettingsOut(BaseModel):
    # The zone new cron schedules are written in when their task names none (null: UTC).
    default_tz: str | None


class ProjectSettingsIn(Body):
    default_tz: str | None = Field(json_schema_extra={"minLength": 1, "maxLength": 64})


@router.get("/{project}/settings", response_model=ProjectSettingsOut)
def show_settings(project: str, db: DbDep, principal: PrincipalDep) -> ProjectSettingsOut:
    def unit(tx: Transaction) -> ProjectSettingsOut:
        found = auth.authorize(tx, principal, project, "task.read")
        return ProjectSettingsOut(default_tz=project_settings.default_zone(tx, found))

    return db.transaction(unit, write=False)


@router.put("/{project}/settings", response_model=ProjectSettingsOut)
def set_settings(
    project: str, body: ProjectSettingsIn, db: DbDep, principal: PrincipalDep
) -> ProjectSettingsOut:
    """Replace the project's settings. ``default_tz`` applies to tasks created (or given their first
    schedule) afterwards; existing schedules keep their zone (docs/tasks.md "Time zones")."""

    def unit(tx: Transaction) -> ProjectSettingsOut:
        found = auth.authorize(tx, principal, project, "project.admin")
        return ProjectSettingsOut(default_tz=project_settings.set_default_zone(tx, found, body.default_tz))

    return db.transaction(unit)
