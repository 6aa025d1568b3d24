"""A project's dependencies: add, remove, list, and the install run (docs/dependencies.md).

Every change of the set, in its own transaction, publishes a new revision of the project's
``ql3-deps`` task (its command installs the whole set, ``domain/dependencies.py:install_script``),
asks the install runs still active to stop (the newest set wins), and queues a run of it: the install
is an ordinary run with its live log, its outcome and its notifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.application import tasks
from ql3.application.cancellation import request_cancel
from ql3.application.runs import CreateRun, create_run
from ql3.domain import dependencies as rules
from ql3.domain.dependencies import Dependency
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.model import Principal, Project, Run
from ql3.ports.storage import Transaction
from ql3.repositories import dependencies as repo
from ql3.repositories import tasks as task_store
from ql3.repositories.dependencies import StoredDependency as StoredDependency

MAX_ACTIVE_SCAN: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """What a change did: the entry and the install run it queued (None when the set is unchanged)."""

    dependency: Dependency
    run: Run | None


def add(tx: Transaction, project: Project, principal: Principal, kind: str, spec: str) -> Change:
    dependency = rules.parse(kind, spec)
    current = {(d.kind, d.name): d for d in repo.list_all(tx, project.id)}
    known = current.get((dependency.kind, dependency.name))
    if known is not None and known.spec == dependency.spec:
        return Change(dependency=dependency, run=None)
    if known is None and len(current) >= rules.MAX_PER_PROJECT:
        raise ValidationFailed("too many dependencies in this project", limit=rules.MAX_PER_PROJECT)
    repo.upsert(tx, project.id, dependency)
    return Change(dependency=dependency, run=_install(tx, project, principal))


def remove(tx: Transaction, project: Project, principal: Principal, kind: str, name: str) -> Change:
    if kind not in rules.KINDS:
        raise ValidationFailed("the kind is python or node", field="kind", allowed=list(rules.KINDS))
    # The key is the parsed name (a Python name is compared normalised: Requests == requests).
    dependency = rules.parse(kind, name)
    if not repo.delete(tx, project.id, dependency.kind, dependency.name):
        raise NotFound("no such dependency in this project")
    return Change(dependency=dependency, run=_install(tx, project, principal))


def list_set(tx: Transaction, project: Project) -> list[StoredDependency]:
    return repo.list_all(tx, project.id)


def install_now(tx: Transaction, project: Project, principal: Principal) -> Run:
    """Install the current set again (``ql3 deps install``): after a failed run, or on a new worker."""
    return _install(tx, project, principal)


def _install(tx: Transaction, project: Project, principal: Principal) -> Run:
    spec = {
        "command": rules.install_script([d.dependency() for d in repo.list_all(tx, project.id)]),
        # pip and npm read their index settings from the worker's environment.
        "environment_policy": "inherit",
        "timeout_ms": rules.INSTALL_TIMEOUT_MS,
    }
    try:
        task = tasks.find_task(tx, project.id, rules.INSTALL_TASK)
    except NotFound:
        task = tasks.create_task(tx, project.id, rules.INSTALL_TASK, spec).task
    else:
        task = tasks.edit_task(tx, project.id, task.id, spec).task
        if not task.enabled:
            task = tasks.set_enabled(tx, project.id, task.id, True).task
    # The newest set wins: an install still running for an older set is asked to stop.
    for run_id in task_store.active_run_ids(tx, task.id, limit=MAX_ACTIVE_SCAN):
        request_cancel(tx, project.id, run_id, reason="policy", actor_type="user", actor_id=principal.id)
    run, _ = create_run(
        tx,
        CreateRun(project_id=project.id, task=task, actor_type="user", actor_id=principal.id),
    )
    return run
