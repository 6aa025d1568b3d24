"""Roles and permissions."""

from __future__ import annotations

from typing import Final, Literal

Role = Literal["viewer", "operator", "approver", "admin"]
ROLES: Final = ("viewer", "operator", "approver", "admin")

PERMISSIONS: Final[dict[str, frozenset[str]]] = {
    "viewer": frozenset({"run.read", "task.read", "worker.read"}),
    "operator": frozenset({"run.read", "task.read", "worker.read", "run.create", "run.stop", "task.write"}),
    "approver": frozenset({"run.read", "task.read", "worker.read", "approval.decide", "approval.recover"}),
    "admin": frozenset(
        {
            "run.read",
            "task.read",
            "worker.read",
            "run.create",
            "run.stop",
            "task.write",
            "approval.decide",
            "approval.recover",
            "token.create",
            "token.manage",
            "worker.manage",
            "project.admin",
        }
    ),
}


def role_allows(role: str, permission: str) -> bool:
    return permission in PERMISSIONS.get(role, frozenset())
