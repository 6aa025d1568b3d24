"""``run_create_target`` (repositories/tasks.py), the API's one read before it creates a run, on both
databases: the same project, role, task and revision as ``project_get``, ``binding_get``,
``find_task`` (an id first, then a name) and ``task_revision_get`` read one by one."""

from __future__ import annotations

from ql3.application import auth, tasks
from ql3.domain.ids import is_id, new_id
from ql3.domain.model import Project
from ql3.ports.storage import Transaction
from ql3.repositories import tasks as task_store
from ql3.repositories.tasks import RunCreateTarget
from tests.support.databases import Harness


def _owner(harness: Harness) -> auth.IssuedToken:
    issued: auth.IssuedToken | None = harness.db.transaction(auth.bootstrap_owner)
    assert issued is not None
    return issued


def _target(harness: Harness, principal_id: str, project: str, task: str) -> RunCreateTarget | None:
    found: RunCreateTarget | None = harness.db.transaction(
        lambda tx: task_store.get_run_create_target(
            tx,
            principal_id=principal_id,
            project_ref=project,
            task_ref=task,
            task_id=task if is_id(task) else None,
        ),
        write=False,
    )
    return found


def test_it_reads_what_the_four_reads_read(harness: Harness) -> None:
    owner = _owner(harness)

    def unit(tx: Transaction) -> tuple[str, tasks.TaskView]:
        member = auth.issue_token(tx, name="member", role="operator", project=owner.project)
        tasks.create_task(tx, owner.project.id, "t", {"command": "true"})
        view = tasks.edit_task(tx, owner.project.id, "t", {"command": "false"})  # revision 2
        return member.principal.id, view

    member_id, view = harness.db.transaction(unit)

    for project_ref in ("default", owner.project.id):
        for task_ref in ("t", view.task.id):
            found = _target(harness, member_id, project_ref, task_ref)
            assert found is not None
            assert found.project.id == owner.project.id
            assert found.role == "operator"
            assert found.task == view.task and view.task.revision == 2
            assert found.revision == view.revision


def test_the_role_is_the_callers_own_binding_in_that_project(harness: Harness) -> None:
    owner = _owner(harness)

    def unit(tx: Transaction) -> tuple[str, str, Project]:
        other = auth.create_project(tx, "other")
        viewer = auth.issue_token(tx, name="viewer", role="viewer", project=owner.project)
        outsider = auth.issue_token(tx, name="outsider", role="admin", project=other)
        tasks.create_task(tx, owner.project.id, "t", {"command": "true"})
        return viewer.principal.id, outsider.principal.id, other

    viewer_id, outsider_id, other = harness.db.transaction(unit)

    as_viewer = _target(harness, viewer_id, "default", "t")
    as_outsider = _target(harness, outsider_id, "default", "t")
    in_other = _target(harness, outsider_id, "other", "t")

    assert as_viewer is not None and as_viewer.role == "viewer"
    assert as_outsider is not None and as_outsider.role is None and as_outsider.task is not None
    assert in_other is not None and in_other.project.id == other.id and in_other.role == "admin"
    assert in_other.task is None and in_other.revision is None  # "t" is the default project's


def test_an_id_is_looked_up_before_a_name_that_looks_like_it(harness: Harness) -> None:
    owner = _owner(harness)

    ghost = new_id()  # an id no task has

    def unit(tx: Transaction) -> tuple[tasks.TaskView, tasks.TaskView]:
        first = tasks.create_task(tx, owner.project.id, "first", {"command": "true"})
        # a task whose name is the first one's id, one named like an id, a project named the default's id
        tasks.create_task(tx, owner.project.id, first.task.id, {"command": "false"})
        lookalike = tasks.create_task(tx, owner.project.id, ghost, {"command": "false"})
        auth.create_project(tx, owner.project.id)
        return first, lookalike

    first, lookalike = harness.db.transaction(unit)
    named_like = harness.db.raw("SELECT id FROM projects WHERE name = ?", (owner.project.id,))[0]["id"]
    assert named_like != owner.project.id

    by_id = _target(harness, owner.principal.id, owner.project.id, first.task.id)
    assert by_id is not None and by_id.project.id == owner.project.id
    assert by_id.task == first.task and by_id.revision == first.revision
    # the name is found when no task has that id
    by_name = _target(harness, owner.principal.id, owner.project.id, ghost)
    assert by_name is not None and by_name.task == lookalike.task
    assert _target(harness, owner.principal.id, named_like, "first") is not None


def test_a_deleted_task_is_not_found_and_a_missing_project_is_none(harness: Harness) -> None:
    owner = _owner(harness)

    def unit(tx: Transaction) -> tasks.TaskView:
        gone = tasks.create_task(tx, owner.project.id, "t", {"command": "true"})
        tasks.delete_task(tx, owner.project.id, "t")
        return gone

    gone = harness.db.transaction(unit)

    by_name = _target(harness, owner.principal.id, "default", "t")
    by_id = _target(harness, owner.principal.id, "default", gone.task.id)
    assert by_name is not None and by_name.task is None and by_name.revision is None
    assert by_id is not None and by_id.task is None
    assert _target(harness, owner.principal.id, "nope", "t") is None

    # a new live task of the same name is the one found
    again = harness.db.transaction(
        lambda tx: tasks.create_task(tx, owner.project.id, "t", {"command": "true"})
    )
    found = _target(harness, owner.principal.id, "default", "t")
    assert found is not None and found.task == again.task
