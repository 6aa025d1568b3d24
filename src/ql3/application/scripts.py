"""A project's scripts (docs/scripts.md): put, show, list, history with diffs, delete; and the payload
a run of a script task carries in its offer."""

from __future__ import annotations

import difflib
from typing import Final

from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.execution import ScriptPayload
from ql3.domain.scripts import (
    MAX_SCRIPTS_PER_PROJECT,
    Script,
    ScriptRevision,
    script_digest,
    validate_script_content,
    validate_script_path,
)
from ql3.ports.storage import Transaction
from ql3.repositories import scripts as store

MAX_SCRIPT_PAGE: Final = 500
MAX_REVISION_PAGE: Final = 200
MAX_DIFF_LINES: Final = 5000


def put_script(
    tx: Transaction, project_id: str, path: str, content: str, *, author: str, source: str = "api"
) -> tuple[Script, bool, bool]:
    """Store ``content`` at ``path`` as a new revision; returns the script, whether it changed (the
    same content again writes nothing) and whether the path was new. Validated before anything is read
    or written."""
    validate_script_path(path)
    validate_script_content(content)
    digest = script_digest(content)
    current = store.get_script(tx, project_id, path)
    if current is not None and current.digest == digest:
        return current, False, False
    if current is None and store.count_scripts(tx, project_id) >= MAX_SCRIPTS_PER_PROJECT:
        raise ValidationFailed(f"a project holds at most {MAX_SCRIPTS_PER_PROJECT} scripts", field="path")
    revision = store.last_revision(tx, project_id, path) + 1
    store.write_revision(
        tx,
        project_id=project_id,
        path=path,
        revision=revision,
        content=content,
        digest=digest,
        author=author[:200],
        source=source[:100],
    )
    written = store.get_script(tx, project_id, path)
    assert written is not None  # written in this transaction
    return written, True, current is None


def get_script(tx: Transaction, project_id: str, path: str) -> Script:
    validate_script_path(path)
    found = store.get_script(tx, project_id, path)
    if found is None:
        raise NotFound("script not found")
    return found


def delete_script(tx: Transaction, project_id: str, path: str, *, author: str, source: str = "api") -> Script:
    """A deletion is a revision too: the history stays and the path may be written again."""
    current = get_script(tx, project_id, path)
    store.write_revision(
        tx,
        project_id=project_id,
        path=path,
        revision=store.last_revision(tx, project_id, path) + 1,
        content=None,
        digest=None,
        author=author[:200],
        source=source[:100],
    )
    return current


def list_scripts(
    tx: Transaction, project_id: str, *, after: str = "", limit: int = MAX_SCRIPT_PAGE
) -> list[Script]:
    if not 1 <= limit <= MAX_SCRIPT_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    return store.list_scripts(tx, project_id, after=after, limit=limit)


def list_revisions(tx: Transaction, project_id: str, path: str) -> list[ScriptRevision]:
    validate_script_path(path)
    found = store.list_revisions(tx, project_id, path, limit=MAX_REVISION_PAGE)
    if not found:
        raise NotFound("script not found")
    return found


def get_revision(tx: Transaction, project_id: str, path: str, revision: int) -> ScriptRevision:
    validate_script_path(path)
    found = store.get_revision(tx, project_id, path, revision)
    if found is None:
        raise NotFound("script revision not found")
    return found


def revision_diff(tx: Transaction, project_id: str, path: str, revision: int) -> str:
    """The unified diff from the previous revision to ``revision`` (the first diffs against nothing)."""
    new = get_revision(tx, project_id, path, revision)
    old = store.get_revision(tx, project_id, path, revision - 1) if revision > 1 else None
    return unified_diff(
        path,
        None if old is None else old.content,
        new.content,
        old_label=f"r{revision - 1}",
        new_label=f"r{revision}",
    )


def unified_diff(path: str, old: str | None, new: str | None, *, old_label: str, new_label: str) -> str:
    lines = list(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile=f"{path}@{old_label}" if old is not None else "/dev/null",
            tofile=f"{path}@{new_label}" if new is not None else "/dev/null",
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more lines\n"]
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def payload(tx: Transaction, project_id: str, path: str) -> ScriptPayload:
    """The script as a run's offer carries it: its current content and digest, or marked missing."""
    found = store.get_script(tx, project_id, path)
    if found is None or found.content is None:
        return ScriptPayload(path=path, digest="", content=None)
    return ScriptPayload(path=path, digest=found.digest, content=found.content)
