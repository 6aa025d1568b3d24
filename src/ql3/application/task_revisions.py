"""The revision history of a task, newest first, for showing what changed between revisions."""

from __future__ import annotations

from typing import Final

from ql3.domain.errors import ValidationFailed
from ql3.domain.model import TaskRevision
from ql3.ports.storage import Transaction
from ql3.repositories import tasks as task_store

MAX_REVISIONS: Final = 50


def list_revisions(tx: Transaction, task_id: str, *, limit: int = MAX_REVISIONS) -> list[TaskRevision]:
    if not 1 <= limit <= MAX_REVISIONS:
        raise ValidationFailed("limit out of range", field="limit")
    return task_store.list_revisions(tx, task_id, limit=limit)
