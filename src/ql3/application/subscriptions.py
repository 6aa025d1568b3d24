"""Subscriptions (docs/scripts.md "Subscriptions"): a git repository synced into a project's scripts,
on a schedule and on demand. Scripts whose header has a QingLong-style ``cron:`` line become tasks:
created, updated, and disabled (never deleted) when the script or its line disappears.

A sync is a run of the project's task ``ql3-sync-NAME`` (``queue_sync``: on demand or on the
subscription's schedule), whose command (``ql3 subscription sync-run NAME``) asks the control plane,
with the run's own credential, to sync (``sync_target`` then ``Syncer.sync``) and prints the sync's log:
the run's log is git's output. The sync itself is a row of ``subscription_syncs`` naming that run, with
the same log. It fetches first, outside any transaction, then applies everything (scripts, tasks, the
file map, the sync's outcome) in one transaction: a sync that fails, at the fetch or while applying,
changes nothing but its own row (and its run fails).
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from ql3.application import notifications, scripts, tasks
from ql3.application import subscription_credentials as credentials
from ql3.application.runs import CreateRun, create_run
from ql3.domain.errors import NameTaken, NotFound, Ql3Error, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Run
from ql3.domain.scripts import (
    INTERPRETERS,
    MAX_SCRIPT_BYTES,
    Subscription,
    SubscriptionSync,
    parse_header,
    task_name_for,
    validate_branch,
    validate_deploy_key,
    validate_glob,
    validate_repo_url,
    validate_script_path,
)
from ql3.domain.tasks import next_fire_ms, validate_cron, validate_name
from ql3.ports import channels
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Database, Transaction
from ql3.ports.vcs import GitCredentials, GitFetcher
from ql3.repositories import scripts as store

MAX_SUBSCRIPTIONS_PAGE: Final = 200
MAX_SYNC_FILES: Final = 1000
MAX_SYNC_LOG_CHARS: Final = 60_000
MAX_SYNCS_SHOWN: Final = 20
FETCH_TIMEOUT_S: Final = 120.0
DUE_PAGE: Final = 4
MIN_TOKEN_CHARS: Final = 8
SYNC_TASK_PREFIX: Final = "ql3-sync-"
# The sync run waits for the control plane's answer: the fetch's timeout and the apply, with room.
SYNC_RUN_TIMEOUT_MS: Final = int(FETCH_TIMEOUT_S * 1000) + 120_000


@dataclass(frozen=True, slots=True, kw_only=True)
class NewSubscription:
    name: str
    repo_url: str
    branch: str | None = None
    path_glob: str | None = None
    cron: str | None = None
    deploy_key: str | None = None
    token: str | None = None


def _author(sub: Subscription) -> str:
    return f"subscription:{sub.name}"


def sync_task_name(name: str) -> str:
    """The task whose runs sync the subscription ``name``."""
    return SYNC_TASK_PREFIX + name


def sync_command(name: str) -> str:
    return "ql3 subscription sync-run " + shlex.quote(name)


def add(tx: Transaction, project_id: str, new: NewSubscription, box: SecretBox | None = None) -> Subscription:
    """Validated before anything is written; the credential is kept sealed with ``box`` (the project
    secrets' key) and never shown again."""
    validate_name(new.name)
    # Its sync task's name must be a valid task name too (the length cap).
    validate_name(sync_task_name(new.name))
    url = validate_repo_url(new.repo_url)
    branch = None if new.branch is None else validate_branch(new.branch)
    glob = None if new.path_glob is None else validate_glob(new.path_glob)
    cron = None if new.cron is None else validate_cron(new.cron)
    if new.deploy_key is not None and new.token is not None:
        raise ValidationFailed("give a deploy key or a token, not both", field="token")
    secret = None
    if new.deploy_key is not None:
        secret = "ssh:" + validate_deploy_key(new.deploy_key)
    elif new.token is not None:
        if not MIN_TOKEN_CHARS <= len(new.token) <= 4096 or any(c.isspace() for c in new.token):
            raise ValidationFailed("invalid token", field="token")
        secret = "token:" + new.token
    sub_id = new_id()
    sub = Subscription(
        id=sub_id,
        project_id=project_id,
        name=new.name,
        repo_url=url,
        branch=branch,
        path_glob=glob,
        cron=cron,
        deploy_key=None if secret is None else credentials.seal(box, project_id, sub_id, secret),
        next_sync_at_ms=None if cron is None else next_fire_ms(cron, tx.now_ms()),
        created_at_ms=tx.now_ms(),
    )
    if not store.insert_subscription(tx, sub):
        raise NameTaken()
    tx.notify(channels.SUBSCRIPTIONS)
    return sub


def find(tx: Transaction, project_id: str, name: str) -> Subscription:
    found = (
        store.get_subscription(tx, project_id, name) if isinstance(name, str) and len(name) <= 128 else None
    )
    if found is None:
        raise NotFound("subscription not found")
    return found


def list_subscriptions(tx: Transaction, project_id: str) -> list[Subscription]:
    return store.list_subscriptions(tx, project_id, limit=MAX_SUBSCRIPTIONS_PAGE)


def remove(tx: Transaction, project_id: str, name: str) -> Subscription:
    """Removes the subscription and its syncs; the scripts and tasks it made stay."""
    sub = find(tx, project_id, name)
    store.delete_subscription(tx, sub.id)
    tx.notify(channels.SUBSCRIPTIONS)
    return sub


def syncs(tx: Transaction, project_id: str, name: str) -> list[SubscriptionSync]:
    return store.list_syncs(tx, find(tx, project_id, name).id, limit=MAX_SYNCS_SHOWN)


def queue_sync(
    tx: Transaction, sub: Subscription, *, trigger_type: str, actor_type: str, actor_id: str | None
) -> Run:
    """Queue a run of the subscription's sync task (made, or set back to the sync command and enabled,
    when needed): the sync happens when a worker runs it, with its own log."""
    name = sync_task_name(sub.name)
    spec = {"command": sync_command(sub.name), "timeout_ms": SYNC_RUN_TIMEOUT_MS}
    try:
        task = tasks.find_task(tx, sub.project_id, name)
    except NotFound:
        task = tasks.create_task(tx, sub.project_id, name, spec).task
    else:
        if tasks.view(tx, task).spec.command != spec["command"]:
            task = tasks.edit_task(tx, sub.project_id, task.id, spec).task
        if not task.enabled:
            task = tasks.set_enabled(tx, sub.project_id, task.id, True).task
    run, _ = create_run(
        tx,
        CreateRun(
            project_id=sub.project_id,
            task=task,
            trigger_type=trigger_type,
            trigger_id=sub.id if trigger_type == "schedule" else None,
            actor_type=actor_type,
            actor_id=actor_id,
        ),
    )
    return run


@dataclass(frozen=True, slots=True)
class SyncTarget:
    subscription_id: str
    trigger: str
    run_id: str


def sync_target(tx: Transaction, credential: str | None) -> SyncTarget:
    """The subscription a running sync run syncs, from the run's own credential: the run must be of
    the task ``ql3-sync-NAME`` whose command is the sync command of subscription ``NAME``."""
    _, _, run = notifications.running_attempt(tx, credential)
    task = tasks.find_task(tx, run.project_id, run.task_id)
    sub = None
    if task.name.startswith(SYNC_TASK_PREFIX):
        sub = store.get_subscription(tx, run.project_id, task.name[len(SYNC_TASK_PREFIX) :])
    if sub is None or tasks.view(tx, task).spec.command != sync_command(sub.name):
        raise ValidationFailed("this run is not a subscription's sync run", field="credential")
    trigger = "schedule" if run.trigger_type == "schedule" else "manual"
    return SyncTarget(subscription_id=sub.id, trigger=trigger, run_id=run.id)


def credentials_of(sub: Subscription, box: SecretBox | None = None) -> GitCredentials:
    """The fetch's credential, opened with ``box`` (``subscription_credentials``)."""
    secret = credentials.plain_credential(sub, box)
    if secret is None:
        return GitCredentials()
    if secret.startswith("ssh:"):
        return GitCredentials(deploy_key=secret[4:])
    return GitCredentials(token=secret.removeprefix("token:"))


def _wanted(rel: str, glob: str | None) -> bool:
    if glob is not None:
        return fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(os.path.basename(rel), glob)
    return any(rel.endswith(suffix) for suffix in INTERPRETERS)


def collect(root: Path, glob: str | None, notes: list[str]) -> dict[str, str]:
    """The checkout's script files by path: symlinks, invalid paths, oversized and non-text files are
    skipped with a note; more than ``MAX_SYNC_FILES`` fails the sync."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in sorted(files):
            full = Path(folder) / name
            rel = full.relative_to(root).as_posix()
            if not _wanted(rel, glob):
                continue
            if full.is_symlink():
                notes.append(f"skipped {rel}: a symbolic link")
                continue
            try:
                validate_script_path(rel)
            except ValidationFailed:
                notes.append(f"skipped {rel}: not a valid script path")
                continue
            if full.stat().st_size > MAX_SCRIPT_BYTES:
                notes.append(f"skipped {rel}: larger than {MAX_SCRIPT_BYTES} bytes")
                continue
            raw = full.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                notes.append(f"skipped {rel}: not UTF-8 text")
                continue
            if "\x00" in text:
                notes.append(f"skipped {rel}: contains NUL")
                continue
            found[rel] = text
            if len(found) > MAX_SYNC_FILES:
                raise ValidationFailed(f"the repository has more than {MAX_SYNC_FILES} matching files")
    return found


def _live_task(tx: Transaction, project_id: str, task_id: str | None) -> tasks.TaskView | None:
    if task_id is None:
        return None
    try:
        return tasks.view(tx, tasks.find_task(tx, project_id, task_id))
    except NotFound:
        return None


def _disable(tx: Transaction, sub: Subscription, task_id: str | None, why: str, notes: list[str]) -> None:
    current = _live_task(tx, sub.project_id, task_id)
    if current is not None and current.task.enabled:
        tasks.set_enabled(tx, sub.project_id, current.task.id, False)
        notes.append(f"disabled task {current.task.name}: {why}")


def _task_for(
    tx: Transaction, sub: Subscription, path: str, content: str, task_id: str | None, notes: list[str]
) -> str | None:
    """Create, update or disable the task of ``path`` from its header; returns the task's id."""
    header = parse_header(content)
    if header.cron is None:
        _disable(tx, sub, task_id, f"{path} has no cron: line", notes)
        return task_id
    try:
        cron = validate_cron(header.cron)
    except ValidationFailed as exc:
        notes.append(f"{path}: cron {header.cron!r} not accepted ({exc}); no task change")
        return task_id
    title = f" ({header.title})" if header.title else ""
    current = _live_task(tx, sub.project_id, task_id)
    if current is None:
        name = task_name_for(path)
        try:
            adopt = tasks.view(tx, tasks.find_task(tx, sub.project_id, name))
        except NotFound:
            created = tasks.create_task(tx, sub.project_id, name, {"script": path, "cron": cron})
            notes.append(f"created task {name}{title}: cron {cron}")
            return created.task.id
        if adopt.spec.script != path:
            notes.append(f"{path}: a task named {name} runs something else; no task made")
            return None
        current = adopt
    if current.spec.cron != cron or current.spec.script != path:
        tasks.edit_task(tx, sub.project_id, current.task.id, {"cron": cron, "script": path})
        notes.append(f"updated task {current.task.name}{title}: cron {cron}")
    if not current.task.enabled:
        notes.append(
            f"task {current.task.name} is disabled: enable it with ql3 task enable {current.task.name}"
        )
    return current.task.id


def apply(tx: Transaction, sub: Subscription, files: dict[str, str], notes: list[str]) -> str:
    """Write the fetched files as scripts and their tasks; returns the summary line."""
    owned = store.subscription_files(tx, sub.id)
    written = 0
    for path, content in sorted(files.items()):
        _, changed, _ = scripts.put_script(
            tx, sub.project_id, path, content, author=_author(sub), source="subscription"
        )
        written += int(changed)
        if changed:
            notes.append(f"wrote {path}")
        task_id = _task_for(tx, sub, path, content, owned.get(path), notes)
        if path not in owned or owned[path] != task_id:
            store.upsert_subscription_file(tx, sub.id, path, task_id)
    removed = 0
    for path, task_id in sorted(owned.items()):
        if path in files:
            continue
        try:
            scripts.delete_script(tx, sub.project_id, path, author=_author(sub), source="subscription")
            removed += 1
            notes.append(f"removed {path}")
        except NotFound:
            pass
        _disable(tx, sub, task_id, f"{path} left the repository", notes)
        store.delete_subscription_file(tx, sub.id, path)
    return f"{len(files)} scripts, {written} changed, {removed} removed"


def _capped(text: str) -> str:
    if len(text) <= MAX_SYNC_LOG_CHARS:
        return text
    return "[... earlier output cut ...]\n" + text[-MAX_SYNC_LOG_CHARS:]


class Syncer:
    """Runs one sync of a subscription: fetch, then one transaction for everything it changes."""

    def __init__(
        self,
        db: Database,
        fetcher: GitFetcher,
        *,
        box: SecretBox | None = None,
        timeout_s: float = FETCH_TIMEOUT_S,
    ) -> None:
        self._db = db
        self._box = box
        self._fetcher = fetcher
        self._timeout_s = timeout_s

    def sync(self, subscription_id: str, trigger: str, run_id: str | None = None) -> SubscriptionSync:
        sync_id = new_id()

        def begin(tx: Transaction) -> Subscription:
            sub = store.get_subscription_by_id(tx, subscription_id)
            if sub is None:
                raise NotFound("subscription not found")
            store.insert_sync(tx, sync_id=sync_id, sub=sub, trigger_type=trigger, run_id=run_id)
            return sub

        sub = self._db.transaction(begin)
        notes: list[str] = []
        try:
            with tempfile.TemporaryDirectory(prefix="ql3-sync-") as folder:
                dest = Path(folder) / "checkout"
                fetched = self._fetcher.fetch(
                    url=sub.repo_url,
                    branch=sub.branch,
                    credentials=credentials_of(sub, self._box),
                    dest=dest,
                    timeout_s=self._timeout_s,
                )
                if not fetched.ok:
                    return self._finish(sync_id, sub, "failed", None, "the fetch failed", fetched.log, notes)
                files = collect(dest, sub.path_glob, notes)
        except (OSError, ValidationFailed) as exc:
            return self._finish(sync_id, sub, "failed", None, str(exc)[:500], "", notes)

        def commit(tx: Transaction) -> SubscriptionSync:
            summary = apply(tx, sub, files, notes)
            text = _capped(fetched.log + "\n".join(notes) + ("\n" if notes else "") + summary + "\n")
            store.finish_sync(
                tx, sync_id, status="succeeded", commit_sha=fetched.commit, summary=summary, log=text
            )
            return self._read(tx, sub, sync_id)

        try:
            done: SubscriptionSync = self._db.transaction(commit)
        except Ql3Error as exc:
            return self._finish(
                sync_id, sub, "failed", fetched.commit, f"nothing applied: {exc}", fetched.log, notes
            )
        return done

    def _finish(
        self,
        sync_id: str,
        sub: Subscription,
        status: str,
        commit: str | None,
        summary: str,
        git_log: str,
        notes: list[str],
    ) -> SubscriptionSync:
        text = _capped(git_log + "\n".join(notes) + ("\n" if notes else "") + summary + "\n")

        def unit(tx: Transaction) -> SubscriptionSync:
            store.finish_sync(tx, sync_id, status=status, commit_sha=commit, summary=summary[:2000], log=text)
            return self._read(tx, sub, sync_id)

        result: SubscriptionSync = self._db.transaction(unit)
        return result

    @staticmethod
    def _read(tx: Transaction, sub: Subscription, sync_id: str) -> SubscriptionSync:
        for found in store.list_syncs(tx, sub.id, limit=MAX_SYNCS_SHOWN):
            if found.id == sync_id:
                return found
        raise NotFound("sync not found")

    def sync_due(self) -> int:
        """Queue a sync run of each subscription whose scheduled time has come, in the transaction that
        claims it by moving its next time (so one replica queues it); returns how many were queued."""
        due = self._db.transaction(lambda tx: store.due_subscriptions(tx, now_ms=tx.now_ms(), limit=DUE_PAGE))
        queued = 0
        for subscription_id in due:

            def claim(tx: Transaction, sid: str = subscription_id) -> bool:
                sub = store.get_subscription_by_id(tx, sid)
                if sub is None or sub.cron is None or sub.next_sync_at_ms is None:
                    return False
                nxt = next_fire_ms(sub.cron, max(tx.now_ms(), sub.next_sync_at_ms))
                if not store.set_next_sync(tx, sid, expected=sub.next_sync_at_ms, next_ms=nxt):
                    return False
                queue_sync(tx, sub, trigger_type="schedule", actor_type="scheduler", actor_id=None)
                return True

            if self._db.transaction(claim):
                queued += 1
        return queued

    def earliest_due(self) -> tuple[int | None, int]:
        """The earliest scheduled sync and the database's now."""
        return self._db.transaction(lambda tx: (store.earliest_due(tx), tx.now_ms()), write=False)


def next_view(sub: Subscription) -> Subscription:
    """The subscription as shown: without its credential."""
    return replace(sub, deploy_key=None)
