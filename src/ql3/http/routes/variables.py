"""Project variables and secrets (docs/variables.md): every task of the project receives the enabled
ones in its environment, a task's own ``env`` value winning.

A secret is write-only: no response carries its value (``value`` is null, ``secret`` true). A plain
value is shown to the roles that may see a task's command (``task.write``, ``approval.decide``);
others see names and notes only. Changing variables needs ``task.write``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status
from pydantic import BaseModel, Field

from ql3.application import auth, variables
from ql3.domain.variables import MAX_IMPORT_BYTES, MAX_NOTE_CHARS, MAX_VARIABLES, VariableInfo, parse_import
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body
from ql3.http.routes.tasks import may_see_command
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/variables", tags=["variables"])
KEY_SCHEMA = {"pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"}


def get_box(request: Request) -> SecretBox | None:
    box: SecretBox | None = request.app.state.secret_box
    return box


BoxDep = Annotated[SecretBox | None, Depends(get_box)]


class VariableOut(BaseModel):
    name: str
    secret: bool
    enabled: bool
    note: str
    value: str | None  # never for a secret; null for roles that may not read plain values
    updated_at_ms: int


class VariablePage(BaseModel):
    items: list[VariableOut]


class VariableIn(Body):
    value: str
    secret: bool = False
    enabled: bool = True
    note: str = Field(default="", json_schema_extra={"maxLength": MAX_NOTE_CHARS})


class VariableImport(Body):
    # QingLong's JSON env export or KEY=VALUE lines (docs/variables.md "Import")
    text: str = Field(json_schema_extra={"maxLength": MAX_IMPORT_BYTES})
    secret: bool = False  # mark every imported variable secret


class ImportOut(BaseModel):
    imported: int
    names: list[str]


def _out(info: VariableInfo) -> VariableOut:
    return VariableOut(
        name=info.name,
        secret=info.secret,
        enabled=info.enabled,
        note=info.note,
        value=info.value,
        updated_at_ms=info.updated_at_ms,
    )


@router.get("", response_model=VariablePage)
def list_variables(project: str, db: DbDep, principal: PrincipalDep) -> VariablePage:
    """The project's variables by name (at most 128); secrets without their values."""

    def unit(tx: Transaction) -> VariablePage:
        found = auth.authorize(tx, principal, project, "task.read")
        reveal = may_see_command(tx, principal, found)
        return VariablePage(items=[_out(v) for v in variables.list_variables(tx, found, reveal=reveal)])

    return db.transaction(unit, write=False)


@router.put("/{name}", response_model=VariableOut)
def set_variable(
    project: str, name: str, body: VariableIn, db: DbDep, principal: PrincipalDep, box: BoxDep
) -> VariableOut:
    """Create or replace a variable; ``secret: true`` seals its value, which is never shown again."""

    def unit(tx: Transaction) -> VariableOut:
        found = auth.authorize(tx, principal, project, "task.write")
        item = variables.SetVariable(
            name=name, value=body.value, secret=body.secret, enabled=body.enabled, note=body.note
        )
        return _out(variables.set_variable(tx, found, item, box))

    return db.transaction(unit)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def delete_variable(project: str, name: str, db: DbDep, principal: PrincipalDep) -> Response:
    def unit(tx: Transaction) -> None:
        found = auth.authorize(tx, principal, project, "task.write")
        variables.remove_variable(tx, found, name)

    db.transaction(unit)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("", response_model=ImportOut)
def import_variables(
    project: str, body: VariableImport, db: DbDep, principal: PrincipalDep, box: BoxDep
) -> ImportOut:
    """Create or replace every variable of an export, all or none; a bad entry is named by its line
    or position (never its value) and nothing is written."""

    def unit(tx: Transaction) -> ImportOut:
        found = auth.authorize(tx, principal, project, "task.write")
        parsed = parse_import(body.text)
        items = [
            variables.SetVariable(
                name=v.name, value=v.value, secret=body.secret, enabled=v.enabled, note=v.note
            )
            for v in parsed
        ]
        count = variables.import_variables(tx, found, items, box)
        return ImportOut(imported=count, names=sorted({v.name for v in parsed})[:MAX_VARIABLES])

    return db.transaction(unit)
