"""Tasks and their immutable revisions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from ql3.application import auth
from ql3.application.schedules import drop_due, next_fire_at, settle_due, sync_schedule
from ql3.domain.digests import TASK_CONTENT_DOMAIN, canonical_json, keyed_digest
from ql3.domain.errors import Conflict, NameTaken, NotFound, ValidationFailed
from ql3.domain.ids import is_id, new_id
from ql3.domain.model import Task, TaskRevision
from ql3.domain.tasks import TaskSpec, build_new_spec, build_spec, validate_task_name
from ql3.domain.timezones import join_cron, split_cron, validate_zone
from ql3.ports.storage import Transaction
from ql3.repositories import project_settings
from ql3.repositories import tasks as task_store

MAX_TASK_PAGE: Final = 200
MAX_SEARCH: Final = 128
MAX_NEXT_FIRES: Final = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskView:
    task: Task
    revision: TaskRevision
    spec: TaskSpec
    next_fire_at_ms: int | None = None


def find_task(tx: Transaction, project_id: str, ref: str) -> Task:
    """A live task by id or name within the project; another project's id is simply not found."""
    if not isinstance(ref, str) or not ref or len(ref) > 128:
        raise NotFound("task not found")
    found = task_store.get_task(tx, project_id, ref) if is_id(ref) else None
    if found is None:  # a name may look like an id
        found = task_store.get_task_by_name(tx, project_id, ref)
    if found is None:
        raise NotFound("task not found")
    return found


def get_revision(tx: Transaction, task_id: str, revision: int) -> TaskRevision:
    """Exact lookup of a pinned revision; there is never a fallback to the latest."""
    found = task_store.get_revision(tx, task_id, revision)
    if found is None:
        raise NotFound("task revision not found")
    return found


def view(tx: Transaction, task: Task) -> TaskView:
    rev = get_revision(tx, task.id, task.revision)
    return TaskView(
        task=task, revision=rev, spec=build_spec(rev.spec), next_fire_at_ms=next_fire_at(tx, task.id)
    )


def content_digest(tx: Transaction, spec: TaskSpec) -> str:
    """The revision's content digest, keyed with the database's secret so that a viewer, who sees the
    digest, cannot confirm a guessed command or env value offline (docs/security.md)."""
    return keyed_digest(auth.task_digest_key(tx), TASK_CONTENT_DOMAIN, canonical_json(spec.to_dict()))


def _insert_revision(tx: Transaction, task_id: str, revision: int, spec: TaskSpec) -> None:
    task_store.insert_revision(
        tx, task_id=task_id, revision=revision, spec=spec.to_dict(), content_digest=content_digest(tx, spec)
    )


def zoned_cron(cron: object, tz: str | None, fallback: str | None) -> object:
    """The cron expression to store (docs/tasks.md "Time zones"): ``tz`` when given (it must agree
    with a ``CRON_TZ=`` prefix in the same request), else the expression's own prefix, else
    ``fallback`` (the project's default zone on create, the task's current zone on edit), else UTC."""
    if tz is not None:
        validate_zone(tz)
    if cron is None:
        if tz is not None:
            raise ValidationFailed("tz needs a cron schedule", field="tz")
        return None
    if not isinstance(cron, str):
        return cron  # build_spec refuses it with the cron field's own error
    own, body = split_cron(cron)
    if tz is not None and own is not None and own != tz:
        raise ValidationFailed(f"the cron's CRON_TZ={own} and tz={tz} disagree", field="tz")
    chosen = tz or own or fallback
    return join_cron(chosen, body) if chosen else cron


def create_task(
    tx: Transaction,
    project_id: str,
    name: str,
    raw_spec: Mapping[str, Any],
    enabled: bool = True,
    *,
    tz: str | None = None,
) -> TaskView:
    """A new task at revision 1. Its cron is evaluated in ``tz``, its ``CRON_TZ=`` prefix, or the
    project's default zone, in that order (UTC when none is set)."""
    validate_task_name(name)
    raw = dict(raw_spec)
    if raw.get("cron") is not None or tz is not None:
        raw["cron"] = zoned_cron(raw.get("cron"), tz, project_settings.get_default_zone(tx, project_id))
    spec = build_new_spec(raw)
    task_id = new_id()
    if not task_store.insert_task(tx, task_id=task_id, project_id=project_id, name=name, enabled=enabled):
        raise NameTaken()
    _insert_revision(tx, task_id, 1, spec)
    created = view(tx, find_task(tx, project_id, task_id))
    sync_schedule(tx, created)
    return replace(created, next_fire_at_ms=next_fire_at(tx, created.task.id))


def edit_task(
    tx: Transaction, project_id: str, ref: str, changes: Mapping[str, Any], *, tz: str | None = None
) -> TaskView:
    """Publish a new revision from the current one plus ``changes``; history is never rewritten. A
    new cron without a zone keeps the task's zone (a task without a schedule gets the project's
    default); ``tz`` moves the schedule, new or current, to that zone."""
    if not changes and tz is None:
        raise ValidationFailed("nothing to change")
    current = view(tx, find_task(tx, project_id, ref))
    merged = current.spec.to_dict()
    merged.update(changes)
    if "cron" in changes or tz is not None:
        if current.spec.cron is not None:
            fallback = split_cron(current.spec.cron)[0]
        else:
            fallback = project_settings.get_default_zone(tx, project_id)
        cron = merged.get("cron")
        if "cron" not in changes and isinstance(cron, str):
            cron = split_cron(cron)[1]  # only the zone moves
        merged["cron"] = zoned_cron(cron, tz, fallback)
    spec = build_new_spec(merged)
    if spec == current.spec:  # by value: a revision made before keyed digests compares the same way
        return current
    # The occurrences already due are decided under the revision they came due with (docs/cron.md).
    settle_due(tx, current)
    new_revision = current.task.revision + 1
    _insert_revision(tx, current.task.id, new_revision, spec)
    _update(tx, current.task, replace(current.task, revision=new_revision))
    edited = view(tx, find_task(tx, project_id, current.task.id))
    sync_schedule(tx, edited)
    return replace(edited, next_fire_at_ms=next_fire_at(tx, edited.task.id))


def _update(tx: Transaction, current: Task, new: Task) -> None:
    if not task_store.update_task(tx, current, enabled=new.enabled, revision=new.revision):
        raise Conflict("the task changed concurrently")


def set_enabled(tx: Transaction, project_id: str, ref: str, enabled: bool) -> TaskView:
    task = find_task(tx, project_id, ref)
    if task.enabled and not enabled:
        settle_due(tx, view(tx, task))  # what came due while enabled is decided before the disable
    if task.enabled != enabled:
        _update(tx, task, replace(task, enabled=enabled))
    changed = view(tx, find_task(tx, project_id, task.id))
    sync_schedule(tx, changed)
    return replace(changed, next_fire_at_ms=next_fire_at(tx, changed.task.id))


def delete_task(tx: Transaction, project_id: str, ref: str) -> Task:
    """Soft delete: runs keep their pinned revisions; the name becomes free again."""
    task = find_task(tx, project_id, ref)
    drop_due(tx, task, "deleted")  # occurrences due and not yet admitted are recorded as skipped
    task_store.delete_task(tx, task.id)
    return task


def list_tasks(
    tx: Transaction,
    project_id: str,
    *,
    after: str = "",
    before: str | None = None,
    search: str | None = None,
    limit: int = MAX_TASK_PAGE,
) -> tuple[list[TaskView], bool]:
    """A page of live tasks in name order: after the name ``after``, or (``before`` given) the page
    just before that name; ``search`` keeps names containing it or ids starting with it
    (docs/console.md "Paging and search"). The flag says whether more tasks lie beyond the page in the
    direction read (after it, or before it when ``before`` is given)."""
    if not 1 <= limit <= MAX_TASK_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    if search is not None and len(search) > MAX_SEARCH:
        raise ValidationFailed("search too long", field="q")
    if before is not None:
        found = task_store.list_tasks_before(
            tx, project_id=project_id, before=before, limit=limit + 1, search=search
        )
        more, found = len(found) > limit, found[-limit:]
    else:
        found = task_store.list_tasks(tx, project_id=project_id, after=after, limit=limit + 1, search=search)
        more, found = len(found) > limit, found[:limit]
    views = [
        TaskView(
            task=t.task,
            revision=t.revision,
            spec=build_spec(t.revision.spec),
            next_fire_at_ms=t.next_fire_at_ms,
        )
        for t in found
    ]
    return views, more


def next_fires(tx: Transaction, project_id: str, *, limit: int = MAX_NEXT_FIRES) -> list[task_store.NextFire]:
    """The project's soonest cron fires, one per enabled task, earliest first."""
    if not 1 <= limit <= MAX_NEXT_FIRES:
        raise ValidationFailed("limit out of range", field="limit")
    return task_store.list_next_fires(tx, project_id=project_id, limit=limit)
