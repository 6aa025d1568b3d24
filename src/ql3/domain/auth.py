"""Roles and permissions."""

from __future__ import annotations

from typing import Final, Literal

from ql3.domain.choices import choose

Role = Literal["viewer", "operator", "approver", "admin"]
ROLES: Final[tuple[Role, ...]] = ("viewer", "operator", "approver", "admin")
# A user signs in by hand, a service is a user's automation, a worker credential serves the worker API.
PrincipalKind = Literal["user", "service", "worker"]
PRINCIPAL_KINDS: Final[tuple[PrincipalKind, ...]] = ("user", "service", "worker")

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


def as_role(value: object) -> Role | None:
    """``value`` as the role it names, or None when it names none."""
    return choose(value, ROLES)


def role_allows(role: str, permission: str) -> bool:
    return permission in PERMISSIONS.get(role, frozenset())
