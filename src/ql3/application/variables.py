"""Project variables and secrets (docs/variables.md): set, list, remove, import, and the environment a
project gives its tasks' runs.

A secret is sealed with the server's ``SecretBox`` before it is written and opened only to build a
run's environment: it is never returned, logged, put in an event or in a notification.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import NotFound, SecretsUnavailable
from ql3.domain.model import Project
from ql3.domain.variables import (
    Variable,
    VariableInfo,
    check_totals,
    environment,
    validate_key,
    validate_note,
    validate_value,
)
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Database, Transaction
from ql3.repositories import variables as repo

CACHE_TTL_S: Final = 1.0


def _context(project_id: str, name: str) -> str:
    return f"ql3.variable.v1\0{project_id}\0{name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SetVariable:
    """One variable to write, as the API and the CLI both give it."""

    name: str
    value: str
    secret: bool = False
    enabled: bool = True
    note: str = ""


def _plain(tx: Transaction, project_id: str, box: SecretBox | None) -> list[Variable]:
    """The project's variables with secrets opened (for the environment and the totals check)."""
    out: list[Variable] = []
    for stored in repo.list_variables(tx, project_id):
        value = stored.value
        if stored.secret:
            if box is None:
                raise SecretsUnavailable()
            value = box.open(stored.value, _context(project_id, stored.name))
        out.append(
            Variable(
                name=stored.name, value=value, secret=stored.secret, enabled=stored.enabled, note=stored.note
            )
        )
    return out


def _write(tx: Transaction, project: Project, items: list[SetVariable], box: SecretBox | None) -> None:
    checked = [
        SetVariable(
            name=validate_key(i.name),
            value=validate_value(i.value),
            secret=i.secret,
            enabled=i.enabled,
            note=validate_note(i.note),
        )
        for i in items
    ]
    if any(i.secret for i in checked) and box is None:
        raise SecretsUnavailable()
    current = {v.name: v for v in _plain(tx, project.id, box)}
    for item in checked:
        current[item.name] = Variable(
            name=item.name, value=item.value, secret=item.secret, enabled=item.enabled, note=item.note
        )
    check_totals(list(current.values()))
    for item in checked:
        stored = box.seal(item.value, _context(project.id, item.name)) if item.secret and box else item.value
        repo.upsert_variable(
            tx,
            project.id,
            name=item.name,
            value=stored,
            secret=item.secret,
            enabled=item.enabled,
            note=item.note,
        )


def set_variable(tx: Transaction, project: Project, item: SetVariable, box: SecretBox | None) -> VariableInfo:
    """Create or replace one variable; bad input is refused before anything is written."""
    _write(tx, project, [item], box)
    return next(v for v in list_variables(tx, project, reveal=True) if v.name == item.name)


def import_variables(
    tx: Transaction, project: Project, items: list[SetVariable], box: SecretBox | None
) -> int:
    """Create or replace every variable of an import, all or none (one transaction)."""
    _write(tx, project, items, box)
    return len(items)


def list_variables(tx: Transaction, project: Project, *, reveal: bool) -> list[VariableInfo]:
    """The project's variables by name: a secret never shows its value; a plain value only when
    ``reveal`` (the roles that may see a task's command, docs/console.md)."""
    return [
        VariableInfo(
            name=s.name,
            secret=s.secret,
            enabled=s.enabled,
            note=s.note,
            value=s.value if reveal and not s.secret else None,
            updated_at_ms=s.updated_at_ms,
        )
        for s in repo.list_variables(tx, project.id)
    ]


def remove_variable(tx: Transaction, project: Project, name: str) -> None:
    if not repo.delete_variable(tx, project.id, validate_key(name)):
        raise NotFound("variable not found")


def secret_values(tx: Transaction, project_id: str, box: SecretBox | None) -> list[str]:
    """The project's secret values, to mask them in the run logs this server serves; none without a
    key (such a server cannot have stored any)."""
    if box is None:
        return []
    return [v.value for v in _plain(tx, project_id, box) if v.secret]


def project_environment(tx: Transaction, project_id: str, box: SecretBox | None) -> dict[str, str]:
    """The environment the project gives a run: its enabled variables, secrets opened."""
    return environment(_plain(tx, project_id, box))


class SharedEnvironments:
    """The project environments the dispatcher and the pull put in offers, read at most once a second
    per project (a change reaches runs offered a second later at most; docs/variables.md). Thread-safe."""

    def __init__(
        self,
        db: Database,
        box: SecretBox | None,
        *,
        ttl_s: float = CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._box = box
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, tuple[tuple[str, str], ...]]] = {}

    def within(self, tx: Transaction, project_id: str) -> tuple[tuple[str, str], ...]:
        """Read now, in the caller's transaction (recovery and replayed offers: rare, never cached)."""
        return tuple(sorted(project_environment(tx, project_id, self._box).items()))

    def __call__(self, project_id: str) -> tuple[tuple[str, str], ...]:
        return self._cached(project_id, None)

    def in_transaction(self, tx: Transaction) -> Callable[[str], tuple[tuple[str, str], ...]]:
        """The same cache, a miss read in ``tx``: for a caller that holds a transaction (the pull),
        which must never wait for a second pool connection."""
        return lambda project_id: self._cached(project_id, tx)

    def _cached(self, project_id: str, tx: Transaction | None) -> tuple[tuple[str, str], ...]:
        now = self._clock()
        with self._lock:
            hit = self._cache.get(project_id)
            if hit is not None and now - hit[0] < self._ttl_s:
                return hit[1]
        if tx is not None:
            env = project_environment(tx, project_id, self._box)
        else:
            env = self._db.transaction(lambda t: project_environment(t, project_id, self._box), write=False)
        pairs = tuple(sorted(env.items()))
        with self._lock:
            if len(self._cache) > 1024:
                self._cache.clear()
            self._cache[project_id] = (now, pairs)
        return pairs
