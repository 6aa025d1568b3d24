"""Scripts on both databases (docs/scripts.md): revisions with author and diff, deletion as a revision,
bad input refused with nothing written, and the script a run's offer carries (content and digest)."""

from __future__ import annotations

import pytest

from ql3.application import scripts
from ql3.application.dispatcher import build_plan
from ql3.application.runs import latest_attempt
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.execution import ExecutionSpec
from ql3.domain.scripts import MAX_SCRIPT_BYTES, script_digest
from ql3.ports.storage import Transaction
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness


def test_revisions_authors_diffs_and_deletion(harness: Harness) -> None:
    db = harness.db
    project = seed_project(db)

    def put(content: str, author: str) -> tuple[int, bool, bool]:
        written, changed, created = db.transaction(
            lambda tx: scripts.put_script(tx, project.id, "lib/sign.py", content, author=author)
        )
        return written.revision, changed, created

    assert put("print(1)\n", "ann") == (1, True, True)
    assert put("print(1)\n", "bob") == (1, False, False)  # same content: nothing written
    assert put("print(2)\n", "bob") == (2, True, False)
    shown = db.transaction(lambda tx: scripts.get_script(tx, project.id, "lib/sign.py"), write=False)
    assert (shown.content, shown.updated_by, shown.digest) == (
        "print(2)\n",
        "bob",
        script_digest("print(2)\n"),
    )
    diff = db.transaction(lambda tx: scripts.revision_diff(tx, project.id, "lib/sign.py", 2), write=False)
    assert "-print(1)\n+print(2)\n" in diff and "lib/sign.py@r1" in diff

    db.transaction(lambda tx: scripts.delete_script(tx, project.id, "lib/sign.py", author="cid"))
    with pytest.raises(NotFound):
        db.transaction(lambda tx: scripts.get_script(tx, project.id, "lib/sign.py"), write=False)
    history = db.transaction(lambda tx: scripts.list_revisions(tx, project.id, "lib/sign.py"), write=False)
    assert [(r.revision, r.author, r.digest is None) for r in history] == [
        (3, "cid", True),
        (2, "bob", False),
        (1, "ann", False),
    ]
    assert put("print(3)\n", "ann") == (4, True, True)  # numbering continues after a deletion
    listed = db.transaction(lambda tx: scripts.list_scripts(tx, project.id), write=False)
    assert [(s.path, s.revision, s.content) for s in listed] == [("lib/sign.py", 4, None)]


BAD_INPUT = [
    ("../etc/passwd", "x"),
    ("a/../../b.py", "x"),
    ("/abs.py", "x"),
    (".hidden.py", "x"),
    ("a//b.py", "x"),
    ("a\\b.py", "x"),
    ("ok.py", "x" * (MAX_SCRIPT_BYTES + 1)),
    ("ok.py", "nul\x00byte"),
]


def test_bad_paths_and_contents_are_refused_with_nothing_written(harness: Harness) -> None:
    project = seed_project(harness.db)
    for path, content in BAD_INPUT:
        with pytest.raises(ValidationFailed):
            harness.db.transaction(
                lambda tx, p=path, c=content: scripts.put_script(tx, project.id, p, c, author="a")
            )
    assert count(harness.db, "script_revisions") == 0
    assert count(harness.db, "scripts") == 0


def _plan(harness: Harness, project_id: str, run_id: str, task_id: str) -> ExecutionSpec:
    def unit(tx: Transaction) -> ExecutionSpec:
        attempt = latest_attempt(tx, run_id)
        assert attempt is not None
        spec, _ = build_plan(tx, run_id, attempt.id, project_id, task_id, 1)
        return spec

    found: ExecutionSpec = harness.db.transaction(unit, write=False)
    return found


def test_a_script_task_offer_carries_the_current_content_and_its_digest(harness: Harness) -> None:
    db = harness.db
    project = seed_project(db)
    db.transaction(lambda tx: scripts.put_script(tx, project.id, "hello.py", "print('v1')\n", author="ann"))
    task = seed_task(db, project, "hello", command=None, script="hello.py")
    run, _ = start_run(db, project, task)
    db.transaction(lambda tx: scripts.put_script(tx, project.id, "hello.py", "print('v2')\n", author="ann"))

    spec = _plan(harness, project.id, run.id, task.id)
    assert spec.command == 'python3 "$QL3_SCRIPT"'
    assert spec.script is not None
    assert (spec.script.content, spec.script.digest) == ("print('v2')\n", script_digest("print('v2')\n"))
    # The wire form round-trips (a remote worker's view) and a tampered content is refused.
    assert ExecutionSpec.from_wire(spec.to_wire()) == spec
    tampered = spec.to_wire()
    tampered["script"]["content"] = "print('evil')\n"
    with pytest.raises(ValidationFailed, match="digest"):
        ExecutionSpec.from_wire(tampered)

    db.transaction(lambda tx: scripts.delete_script(tx, project.id, "hello.py", author="ann"))
    missing = _plan(harness, project.id, run.id, task.id)
    assert missing.script is not None and missing.script.content is None
    assert ExecutionSpec.from_wire(missing.to_wire()).script == missing.script
