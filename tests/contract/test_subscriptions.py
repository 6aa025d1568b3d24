"""Subscriptions on both databases (docs/scripts.md "Subscriptions"): a sync writes the repository's
scripts and makes tasks from their ``cron:`` headers, a later sync updates them and disables (never
deletes) the task of a script that left; a failed fetch changes nothing but its own record; bad
input is refused with nothing written; a due subscription is synced once by the schedule."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ql3.application import scripts, subscription_credentials, subscriptions, tasks
from ql3.application.notifications import NotifyCredentialInvalid
from ql3.domain import notifications as notify_rules
from ql3.domain.errors import NameTaken, SecretsUnavailable, ValidationFailed
from ql3.domain.scripts import Subscription, SubscriptionSync
from ql3.ports.vcs import FetchResult, GitCredentials
from ql3.storage.secret_box import AesGcmBox
from tests.support.builders import count, seed_project
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, start

CB_TOKEN = "cb-token-for-the-sync-run"


@dataclass
class FakeRepo:
    """A fetcher serving an in-memory tree; ``ok=False`` fails the fetch like an unreachable remote."""

    files: dict[str, str] = field(default_factory=dict)
    ok: bool = True
    seen: list[GitCredentials] = field(default_factory=list)

    def fetch(
        self, *, url: str, branch: str | None, credentials: GitCredentials, dest: Path, timeout_s: float
    ) -> FetchResult:
        self.seen.append(credentials)
        if not self.ok:
            return FetchResult(ok=False, commit=None, log=f"fatal: could not read from {url}\n")
        for rel, text in self.files.items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text)
        return FetchResult(ok=True, commit="c0ffee", log="$ git clone\n")


BOX = AesGcmBox(os.urandom(32))
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
SIGN = "# cron: 0 8 * * *\n# new Env('Daily sign')\nprint('sign')\n"


def _add(harness: Harness, project_id: str, **fields: object) -> Subscription:
    new = subscriptions.NewSubscription(**{"name": "repo", "repo_url": "file:///srv/repo.git", **fields})  # type: ignore[arg-type]
    sub: Subscription = harness.db.transaction(lambda tx: subscriptions.add(tx, project_id, new, BOX))
    return sub


def _tasks(harness: Harness, project_id: str) -> dict[str, tuple[bool, str | None, str | None]]:
    views, _ = harness.db.transaction(lambda tx: tasks.list_tasks(tx, project_id), write=False)
    return {v.task.name: (v.task.enabled, v.spec.cron, v.spec.script) for v in views}


def test_a_sync_makes_updates_and_disables_tasks_from_cron_headers(harness: Harness) -> None:
    project = seed_project(harness.db)
    sub = _add(harness, project.id)
    repo = FakeRepo(files={"jobs/sign.py": SIGN, "lib/util.py": "X = 1\n", "README.md": "docs"})
    syncer = subscriptions.Syncer(harness.db, repo)

    first = syncer.sync(sub.id, "manual")
    assert (first.status, first.commit_sha) == ("succeeded", "c0ffee"), first.log
    assert "created task jobs_sign.py (Daily sign): cron 0 8 * * *" in first.log
    listed = harness.db.transaction(lambda tx: scripts.list_scripts(tx, project.id), write=False)
    assert [(s.path, s.updated_by) for s in listed] == [
        ("jobs/sign.py", "subscription:repo"),
        ("lib/util.py", "subscription:repo"),
    ]
    assert _tasks(harness, project.id) == {"jobs_sign.py": (True, "0 8 * * *", "jobs/sign.py")}

    repo.files["jobs/sign.py"] = SIGN.replace("0 8", "30 9")
    second = syncer.sync(sub.id, "manual")
    assert "updated task jobs_sign.py" in second.log
    assert _tasks(harness, project.id)["jobs_sign.py"] == (True, "30 9 * * *", "jobs/sign.py")

    del repo.files["jobs/sign.py"]
    third = syncer.sync(sub.id, "manual")
    assert "removed jobs/sign.py" in third.log and "disabled task jobs_sign.py" in third.log
    assert _tasks(harness, project.id) == {"jobs_sign.py": (False, "30 9 * * *", "jobs/sign.py")}
    assert [s.path for s in harness.db.transaction(lambda tx: scripts.list_scripts(tx, project.id))] == [
        "lib/util.py"
    ]


def test_a_failed_fetch_or_apply_changes_nothing_but_its_record(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = seed_project(harness.db)
    sub = _add(harness, project.id, token="s3cret-token-value")
    repo = FakeRepo(files={"a.sh": "echo a\n", "b.sh": SIGN}, ok=False)
    syncer = subscriptions.Syncer(harness.db, repo, box=BOX)

    # an unreachable remote: git's output is the record, nothing else is written
    failed = syncer.sync(sub.id, "manual")
    assert (failed.status, failed.summary) == ("failed", "the fetch failed")
    assert "could not read" in failed.log
    assert repo.seen == [GitCredentials(token="s3cret-token-value")]

    # a failure while applying, after a.sh and b.sh were written in the sync's transaction
    def broken(*args: object, **kwargs: object) -> None:
        raise ValidationFailed("the task store refused")

    repo.ok = True
    monkeypatch.setattr(tasks, "create_task", broken)
    undone = syncer.sync(sub.id, "manual")
    assert (undone.status, undone.commit_sha) == ("failed", "c0ffee")
    assert "nothing applied: the task store refused" in (undone.summary or "")
    tables = ("scripts", "script_revisions", "tasks", "subscription_files")
    assert [count(harness.db, table) for table in tables] == [0, 0, 0, 0]
    assert count(harness.db, "subscription_syncs") == 2


def test_bad_subscriptions_are_refused_and_a_due_one_is_synced_once(harness: Harness) -> None:
    project = seed_project(harness.db)
    bad: list[dict[str, object]] = [
        {"repo_url": "ext::sh -c touch% /tmp/pwned"},
        {"repo_url": "/srv/local/path"},
        {"branch": "--upload-pack=evil"},
        {"cron": "not a cron"},
        {"deploy_key": "not a key"},
        {"name": "bad/name"},
        {"deploy_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n", "token": "tokentoken"},
    ]
    for fields in bad:
        with pytest.raises(ValidationFailed):
            _add(harness, project.id, **fields)
    assert count(harness.db, "subscriptions") == 0

    sub = _add(harness, project.id, cron="*/5 * * * *")
    with pytest.raises(NameTaken):
        _add(harness, project.id)
    repo = FakeRepo(files={"a.sh": "echo a\n"})
    syncer = subscriptions.Syncer(harness.db, repo)
    assert syncer.sync_due() == 0  # not due yet

    assert sub.next_sync_at_ms is not None
    harness.advance_clock(sub.next_sync_at_ms - harness.now_ms() + 1)
    assert syncer.sync_due() == 1
    assert syncer.sync_due() == 0  # its next time moved on
    # The schedule queued one run of the subscription's sync task; the sync happens when it runs.
    (run,) = [dict(r) for r in harness.db.raw("SELECT id, task_id, trigger_type FROM runs")]
    assert run["trigger_type"] == "schedule"
    assert _tasks(harness, project.id)["ql3-sync-repo"] == (True, None, None)
    done = _run_the_sync(harness, run["id"], repo)
    assert (done.trigger_type, done.status, done.run_id) == ("schedule", "succeeded", run["id"])
    assert [s.run_id for s in harness.db.transaction(
        lambda tx: subscriptions.syncs(tx, project.id, "repo"), write=False
    )] == [run["id"]]  # fmt: skip


def _run_the_sync(harness: Harness, run_id: str, repo: FakeRepo) -> SubscriptionSync:
    """A worker takes the sync run; its command calls back with the run's credential."""
    register(harness.db, lease_ms=600_000)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None and offer.fence.run_id == run_id
    start(harness.db, offer, token=CB_TOKEN)
    credential = notify_rules.notify_token(offer.fence.attempt_id, CB_TOKEN)
    target = harness.db.transaction(lambda tx: subscriptions.sync_target(tx, credential), write=False)
    assert target.run_id == run_id
    return subscriptions.Syncer(harness.db, repo, box=BOX).sync(
        target.subscription_id, target.trigger, target.run_id
    )


def test_an_on_demand_sync_is_a_run_and_only_a_sync_runs_credential_syncs(harness: Harness) -> None:
    project = seed_project(harness.db)
    sub = _add(harness, project.id)
    run = harness.db.transaction(
        lambda tx: subscriptions.queue_sync(tx, sub, trigger_type="manual", actor_type="user", actor_id="u1")
    )
    assert (run.trigger_type, run.status) == ("manual", "queued")
    view = _tasks(harness, project.id)
    assert view["ql3-sync-repo"] == (True, None, None)
    spec = harness.db.transaction(
        lambda tx: tasks.view(tx, tasks.find_task(tx, project.id, "ql3-sync-repo")).spec, write=False
    )
    assert spec.command == "ql3 subscription sync-run repo"

    done = _run_the_sync(harness, run.id, FakeRepo(files={"jobs/sign.py": SIGN}))

    assert (done.trigger_type, done.status, done.run_id) == ("manual", "succeeded", run.id)
    assert "jobs_sign.py" in _tasks(harness, project.id)
    # A credential that is not a running sync run's syncs nothing.
    with pytest.raises(NotifyCredentialInvalid):
        harness.db.transaction(lambda tx: subscriptions.sync_target(tx, "ql3r_nope"), write=False)


def test_a_run_of_another_task_cannot_sync(harness: Harness) -> None:
    project, _, (run,) = queued(harness.db)
    _add(harness, project.id)
    register(harness.db, lease_ms=600_000)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None and offer.fence.run_id == run.id
    start(harness.db, offer, token=CB_TOKEN)
    credential = notify_rules.notify_token(offer.fence.attempt_id, CB_TOKEN)

    with pytest.raises(ValidationFailed, match="not a subscription's sync run"):
        harness.db.transaction(lambda tx: subscriptions.sync_target(tx, credential), write=False)


def _stored(harness: Harness) -> dict[str, str | None]:
    return {r["name"]: r["deploy_key"] for r in harness.db.raw("SELECT name, deploy_key FROM subscriptions")}


def test_a_credential_is_sealed_at_rest_and_opened_only_for_the_fetch(harness: Harness) -> None:
    project = seed_project(harness.db)
    with_key = _add(harness, project.id, name="keyed", deploy_key=KEY)
    with_token = _add(harness, project.id, name="tokened", token="s3cret-token-value")
    _add(harness, project.id, name="open")

    # the database holds neither value, nor their plaintext forms
    stored = _stored(harness)
    assert stored["open"] is None
    for name in ("keyed", "tokened"):
        value = stored[name]
        assert value is not None and value.startswith("aesgcm1:"), value
        assert "PRIVATE KEY" not in value and "s3cret-token-value" not in value and "ssh:" not in value
    assert with_key.deploy_key != KEY and with_token.deploy_key == stored["tokened"]

    # the fetch gets each in the clear
    repo = FakeRepo(files={"a.sh": "echo a\n"})
    syncer = subscriptions.Syncer(harness.db, repo, box=BOX)
    assert syncer.sync(with_key.id, "manual").status == "succeeded"
    assert syncer.sync(with_token.id, "manual").status == "succeeded"
    assert repo.seen == [GitCredentials(deploy_key=KEY), GitCredentials(token="s3cret-token-value")]

    # another key, no key, or a sealed value moved to another subscription's row: the sync fails
    # (naming no value) and changes nothing
    for other in (AesGcmBox(os.urandom(32)), None):
        failed = subscriptions.Syncer(harness.db, repo, box=other).sync(with_token.id, "manual")
        assert failed.status == "failed" and "credential" in (failed.summary or ""), failed
    harness.db.raw("UPDATE subscriptions SET deploy_key = ? WHERE name = 'open'", (stored["tokened"],))
    moved = next(
        s
        for s in harness.db.transaction(lambda tx: subscriptions.list_subscriptions(tx, project.id))
        if s.name == "open"
    )
    assert subscriptions.Syncer(harness.db, repo, box=BOX).sync(moved.id, "manual").status == "failed"
    assert len(repo.seen) == 2

    # a server without the key keeps no credential
    with pytest.raises(SecretsUnavailable):
        new = subscriptions.NewSubscription(
            name="nokey", repo_url="file:///srv/r.git", token="s3cret-token-2"
        )
        harness.db.transaction(lambda tx: subscriptions.add(tx, project.id, new, None))
    assert "nokey" not in _stored(harness)


def test_plaintext_credentials_of_an_older_version_are_sealed_once(harness: Harness) -> None:
    project = seed_project(harness.db)
    keyed = _add(harness, project.id, name="keyed", deploy_key=KEY)
    tokened = _add(harness, project.id, name="tokened", token="s3cret-token-value")
    sealed_before = _stored(harness)["keyed"]
    # as an older version stored them
    harness.db.raw("UPDATE subscriptions SET deploy_key = ? WHERE name = 'keyed'", ("ssh:" + KEY,))
    harness.db.raw(
        "UPDATE subscriptions SET deploy_key = ? WHERE name = 'tokened'", ("token:s3cret-token-value",)
    )
    repo = FakeRepo(files={"a.sh": "echo a\n"})
    # (still read meanwhile)
    assert subscriptions.Syncer(harness.db, repo, box=BOX).sync(tokened.id, "manual").status == "succeeded"

    assert subscription_credentials.seal_stored(harness.db, BOX) == 2
    assert subscription_credentials.seal_stored(harness.db, BOX) == 0

    stored = _stored(harness)
    for name in ("keyed", "tokened"):
        value = stored[name]
        assert value is not None and value.startswith("aesgcm1:") and value != sealed_before
        assert "PRIVATE KEY" not in value and "s3cret-token-value" not in value
    syncer = subscriptions.Syncer(harness.db, repo, box=BOX)
    assert syncer.sync(keyed.id, "manual").status == "succeeded"
    assert syncer.sync(tokened.id, "manual").status == "succeeded"
    assert repo.seen[1:] == [GitCredentials(deploy_key=KEY), GitCredentials(token="s3cret-token-value")]
