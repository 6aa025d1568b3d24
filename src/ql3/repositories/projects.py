"""Projects: the namespace every task, run, token role and approval belongs to."""

from __future__ import annotations

from ql3.domain.model import Project
from ql3.ports.storage import Row, Transaction


def project_from_row(row: Row) -> Project:
    return Project(
        id=row["id"], name=row["name"], version=int(row["version"]), created_at_ms=row["created_at_ms"]
    )


def get_project(tx: Transaction, ref: str) -> Project | None:
    """The project whose id or name is ``ref``."""
    row = tx.one("project_get", {"ref": ref})
    return None if row is None else project_from_row(row)


def list_projects(tx: Transaction, *, after: str, limit: int) -> list[Project]:
    """All projects by name, after ``after``."""
    return [project_from_row(row) for row in tx.all("project_list", {"after": after, "limit": limit})]


def insert_project(tx: Transaction, *, project_id: str, name: str) -> bool:
    """A new project at version 1; False when the name (or id) is taken."""
    return tx.run("project_insert", {"id": project_id, "name": name, "now": tx.now_ms()}) == 1


def bump_project_version(tx: Transaction, project_id: str) -> None:
    """Move the project's version: it is half of an approval's policy fence (``policy_fence`` in
    ``domain/approvals.py``), so a new, revoked or rotated token in the project moves that fence."""
    tx.run("project_bump_version", {"id": project_id})
