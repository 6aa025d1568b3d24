"""A project's scripts (docs/scripts.md). Listing needs ``task.read``; the content, the history's
diffs and every write need the roles that may see a task's command (``task.write`` or
``approval.decide`` to read, ``task.write`` to change)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status
from pydantic import BaseModel, Field

from ql3.application import auth, scripts
from ql3.domain.errors import PermissionDenied
from ql3.domain.model import Principal, Project
from ql3.domain.scripts import MAX_SCRIPT_BYTES, PATH_PATTERN, Script, ScriptRevision
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body
from ql3.http.routes.tasks import may_see_command
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}", tags=["scripts"])
ScriptPath = Annotated[
    str,
    Path(
        max_length=255,
        pattern=PATH_PATTERN,
        description="a relative path: segments of letters, digits, '.', '_', '-', '+', '@' "
        "(no '..', no segment starting with '.')",
    ),
]


class ScriptPut(Body):
    content: str = Field(description=f"UTF-8 text, at most {MAX_SCRIPT_BYTES} bytes")


class ScriptOut(BaseModel):
    path: str
    revision: int
    digest: str
    size_bytes: int
    updated_at_ms: int
    updated_by: str
    content: str | None = Field(default=None, description="only on a script's own page, to its readers")


class ScriptWritten(ScriptOut):
    changed: bool


class ScriptPage(BaseModel):
    items: list[ScriptOut]
    next_cursor: str | None


class ScriptRevisionOut(BaseModel):
    revision: int
    deleted: bool
    digest: str | None
    author: str
    source: str
    created_at_ms: int
    content: str | None = None
    diff: str | None = None


class ScriptRevisionPage(BaseModel):
    items: list[ScriptRevisionOut]


def script_out(found: Script, *, content: bool) -> ScriptOut:
    return ScriptOut(
        path=found.path,
        revision=found.revision,
        digest=found.digest,
        size_bytes=found.size_bytes,
        updated_at_ms=found.updated_at_ms,
        updated_by=found.updated_by,
        content=found.content if content else None,
    )


def _revision_out(rev: ScriptRevision, *, diff: str | None = None) -> ScriptRevisionOut:
    return ScriptRevisionOut(
        revision=rev.revision,
        deleted=rev.digest is None,
        digest=rev.digest,
        author=rev.author,
        source=rev.source,
        created_at_ms=rev.created_at_ms,
        content=rev.content,
        diff=diff,
    )


def _reader(tx: Transaction, principal: Principal, project: str) -> Project:
    found = auth.authorize(tx, principal, project, "task.read")
    if not may_see_command(tx, principal, found):
        raise PermissionDenied(permission="task.write")
    return found


@router.get("/scripts", response_model=ScriptPage)
def list_scripts(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[str | None, Query(max_length=255)] = None,
    limit: Annotated[int, Query(ge=1, le=scripts.MAX_SCRIPT_PAGE)] = 200,
) -> ScriptPage:
    """The project's scripts by path (no content)."""

    def unit(tx: Transaction) -> ScriptPage:
        found = auth.authorize(tx, principal, project, "task.read")
        items = scripts.list_scripts(tx, found.id, after=cursor or "", limit=limit)
        next_cursor = items[-1].path if len(items) == limit else None
        return ScriptPage(items=[script_out(s, content=False) for s in items], next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.get("/scripts/{path:path}", response_model=ScriptOut)
def show_script(project: str, path: ScriptPath, db: DbDep, principal: PrincipalDep) -> ScriptOut:
    def unit(tx: Transaction) -> ScriptOut:
        found = _reader(tx, principal, project)
        return script_out(scripts.get_script(tx, found.id, path), content=True)

    return db.transaction(unit, write=False)


@router.put(
    "/scripts/{path:path}",
    response_model=ScriptWritten,
    responses={201: {"model": ScriptWritten, "description": "the path was new"}},
)
def put_script(
    project: str, path: ScriptPath, body: ScriptPut, db: DbDep, principal: PrincipalDep, response: Response
) -> ScriptWritten:
    """Create or change a script: a new revision authored by the caller (the same content again
    writes nothing: ``changed`` is false). 201 when the path was new."""

    def unit(tx: Transaction) -> tuple[Script, bool, bool]:
        found = auth.authorize(tx, principal, project, "task.write")
        return scripts.put_script(tx, found.id, path, body.content, author=principal.name)

    written, changed, created = db.transaction(unit)
    if created:
        response.status_code = status.HTTP_201_CREATED
    return ScriptWritten(**script_out(written, content=False).model_dump(), changed=changed)


@router.delete("/scripts/{path:path}", status_code=status.HTTP_204_NO_CONTENT)
def delete_script(project: str, path: ScriptPath, db: DbDep, principal: PrincipalDep) -> Response:
    """Remove a script: its history stays (the deletion is a revision); tasks naming it fail to start."""

    def unit(tx: Transaction) -> None:
        found = auth.authorize(tx, principal, project, "task.write")
        scripts.delete_script(tx, found.id, path, author=principal.name)

    db.transaction(unit)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/script-history/{path:path}", response_model=ScriptRevisionPage)
def script_history(
    project: str,
    path: ScriptPath,
    db: DbDep,
    principal: PrincipalDep,
    revision: Annotated[int | None, Query(ge=1, le=10**9)] = None,
) -> ScriptRevisionPage:
    """A script's revisions, newest first (author, source, time); with ``revision``, that one revision
    with its content and its diff from the one before."""

    def unit(tx: Transaction) -> ScriptRevisionPage:
        found = _reader(tx, principal, project)
        if revision is not None:
            rev = scripts.get_revision(tx, found.id, path, revision)
            diff = scripts.revision_diff(tx, found.id, path, revision)
            return ScriptRevisionPage(items=[_revision_out(rev, diff=diff)])
        return ScriptRevisionPage(
            items=[_revision_out(r) for r in scripts.list_revisions(tx, found.id, path)]
        )

    return db.transaction(unit, write=False)
