"""Roles and permissions."""

from __future__ import annotations

from typing import Final, Literal

from ql3.domain.choices import choose

# ``metrics``: a Prometheus scrape token, which reads /metrics with its project's task names and
# nothing else (docs/operations.md "Prometheus").
Role = Literal["viewer", "operator", "approver", "admin", "metrics"]
ROLES: Final[tuple[Role, ...]] = ("viewer", "operator", "approver", "admin", "metrics")
# A user signs in by hand, a service is a user's automation, a worker credential serves the worker API.
PrincipalKind = Literal["user", "service", "worker"]
PRINCIPAL_KINDS: Final[tuple[PrincipalKind, ...]] = ("user", "service", "worker")

PERMISSIONS: Final[dict[str, frozenset[str]]] = {
    "metrics": frozenset({"metrics.read"}),
    "viewer": frozenset({"run.read", "task.read", "worker.read", "metrics.read"}),
    "operator": frozenset(
        {"run.read", "task.read", "worker.read", "metrics.read", "run.create", "run.stop", "task.write"}
    ),
    "approver": frozenset(
        {"run.read", "task.read", "worker.read", "metrics.read", "approval.decide", "approval.recover"}
    ),
    "admin": frozenset(
        {
            "run.read",
            "task.read",
            "worker.read",
            "metrics.read",
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
