"""Project variables as stored (docs/variables.md): a secret's ``value`` is its sealed text here; the
use case (application/variables.py) seals and opens it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ql3.domain.variables import MAX_VARIABLES
from ql3.ports.storage import Transaction


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredVariable:
    name: str
    value: str = field(repr=False)  # sealed for a secret
    secret: bool
    enabled: bool
    note: str
    updated_at_ms: int


def list_variables(tx: Transaction, project_id: str) -> list[StoredVariable]:
    """The project's variables by name (the project cap bounds the read)."""
    rows = tx.all("variable_list", {"project_id": project_id, "limit": MAX_VARIABLES})
    return [
        StoredVariable(
            name=row["name"],
            value=row["value"],
            secret=bool(row["secret"]),
            enabled=bool(row["enabled"]),
            note=row["note"],
            updated_at_ms=int(row["updated_at_ms"]),
        )
        for row in rows[: MAX_VARIABLES + 1]
    ]


def upsert_variable(
    tx: Transaction, project_id: str, *, name: str, value: str, secret: bool, enabled: bool, note: str
) -> None:
    """Create or replace one variable (``value`` already sealed for a secret)."""
    tx.run(
        "variable_upsert",
        {
            "project_id": project_id,
            "name": name,
            "value": value,
            "secret": secret,
            "enabled": enabled,
            "note": note,
            "now": tx.now_ms(),
        },
    )


def delete_variable(tx: Transaction, project_id: str, name: str) -> bool:
    """Remove one variable; False when it did not exist."""
    return tx.run("variable_delete", {"project_id": project_id, "name": name}) == 1
