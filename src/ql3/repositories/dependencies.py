"""A project's dependency set (docs/dependencies.md): one row per (project, kind, name)."""

from __future__ import annotations

from dataclasses import dataclass

from ql3.domain.dependencies import Dependency, DependencyKind
from ql3.ports.storage import Transaction


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredDependency:
    kind: DependencyKind
    name: str
    spec: str
    created_at_ms: int
    updated_at_ms: int

    def dependency(self) -> Dependency:
        return Dependency(kind=self.kind, name=self.name, spec=self.spec)


def upsert(tx: Transaction, project_id: str, dependency: Dependency) -> None:
    """Add ``dependency``, or replace the spec of the entry with its kind and name."""
    tx.run(
        "deps_upsert",
        {
            "project_id": project_id,
            "kind": dependency.kind,
            "name": dependency.name,
            "spec": dependency.spec,
            "now": tx.now_ms(),
        },
    )


def delete(tx: Transaction, project_id: str, kind: DependencyKind, name: str) -> bool:
    """Remove one entry; False when there was none."""
    return tx.run("deps_delete", {"project_id": project_id, "kind": kind, "name": name}) == 1


def list_all(tx: Transaction, project_id: str) -> list[StoredDependency]:
    return [
        StoredDependency(
            kind=row["kind"],
            name=row["name"],
            spec=row["spec"],
            created_at_ms=int(row["created_at_ms"]),
            updated_at_ms=int(row["updated_at_ms"]),
        )
        for row in tx.all("deps_list", {"project_id": project_id})
    ]


def count(tx: Transaction, project_id: str) -> int:
    row = tx.one("deps_count", {"project_id": project_id})
    return 0 if row is None else int(row["n"])
