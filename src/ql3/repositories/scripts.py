"""Scripts and their revisions, subscriptions, their syncs and file maps (docs/scripts.md)."""

from __future__ import annotations

from ql3.domain.scripts import MAX_SCRIPTS_PER_PROJECT, Script, ScriptRevision, Subscription, SubscriptionSync
from ql3.ports.storage import Row, Transaction


def _script(row: Row) -> Script:
    return Script(
        project_id=row["project_id"],
        path=row["path"],
        revision=int(row["revision"]),
        digest=row["digest"],
        size_bytes=int(row["size_bytes"]),
        updated_at_ms=int(row["updated_at_ms"]),
        updated_by=row["updated_by"],
        content=row["content"],
    )


def _revision(row: Row) -> ScriptRevision:
    return ScriptRevision(
        project_id=row["project_id"],
        path=row["path"],
        revision=int(row["revision"]),
        content=row["content"],
        digest=row["digest"],
        author=row["author"],
        source=row["source"],
        created_at_ms=int(row["created_at_ms"]),
    )


def get_script(tx: Transaction, project_id: str, path: str) -> Script | None:
    row = tx.one("script_get", {"project_id": project_id, "path": path})
    return None if row is None else _script(row)


def list_scripts(tx: Transaction, project_id: str, *, after: str, limit: int) -> list[Script]:
    rows = tx.all("script_list", {"project_id": project_id, "after": after, "limit": limit})
    return [_script(row) for row in rows]


def count_scripts(tx: Transaction, project_id: str) -> int:
    row = tx.one("script_count", {"project_id": project_id})
    return 0 if row is None else int(row["n"])


def last_revision(tx: Transaction, project_id: str, path: str) -> int:
    row = tx.one("script_last_revision", {"project_id": project_id, "path": path})
    return 0 if row is None else int(row["revision"])


def write_revision(
    tx: Transaction,
    *,
    project_id: str,
    path: str,
    revision: int,
    content: str | None,
    digest: str | None,
    author: str,
    source: str,
) -> None:
    """Append the revision and move (or, for a deletion, remove) the path's live row."""
    now = tx.now_ms()
    tx.run(
        "script_revision_insert",
        {
            "project_id": project_id,
            "path": path,
            "revision": revision,
            "content": content,
            "digest": digest,
            "author": author,
            "source": source,
            "now": now,
        },
    )
    if content is None:
        tx.run("script_delete", {"project_id": project_id, "path": path})
        return
    tx.run(
        "script_upsert",
        {
            "project_id": project_id,
            "path": path,
            "revision": revision,
            "digest": digest,
            "size_bytes": len(content.encode()),
            "now": now,
            "author": author,
        },
    )


def get_revision(tx: Transaction, project_id: str, path: str, revision: int) -> ScriptRevision | None:
    row = tx.one("script_revision_get", {"project_id": project_id, "path": path, "revision": revision})
    return None if row is None else _revision(row)


def list_revisions(tx: Transaction, project_id: str, path: str, *, limit: int) -> list[ScriptRevision]:
    rows = tx.all("script_revision_list", {"project_id": project_id, "path": path, "limit": limit})
    return [_revision(row) for row in rows]


# -- subscriptions ------------------------------------------------------------------------------


def _subscription(row: Row) -> Subscription:
    nxt = row["next_sync_at_ms"]
    return Subscription(
        id=row["id"],
        project_id=row["project_id"],
        name=row["name"],
        repo_url=row["repo_url"],
        branch=row["branch"],
        path_glob=row["path_glob"],
        cron=row["cron"],
        deploy_key=row["deploy_key"],
        next_sync_at_ms=None if nxt is None else int(nxt),
        created_at_ms=int(row["created_at_ms"]),
    )


def _sync(row: Row) -> SubscriptionSync:
    ended = row["ended_at_ms"]
    return SubscriptionSync(
        id=row["id"],
        subscription_id=row["subscription_id"],
        project_id=row["project_id"],
        trigger_type=row["trigger_type"],
        status=row["status"],
        commit_sha=row["commit_sha"],
        summary=row["summary"],
        log=row["log"],
        started_at_ms=int(row["started_at_ms"]),
        ended_at_ms=None if ended is None else int(ended),
        run_id=row["run_id"],
    )


def insert_subscription(tx: Transaction, sub: Subscription) -> bool:
    """False when the project already has a subscription of that name."""
    params = {
        "id": sub.id,
        "project_id": sub.project_id,
        "name": sub.name,
        "repo_url": sub.repo_url,
        "branch": sub.branch,
        "path_glob": sub.path_glob,
        "cron": sub.cron,
        "deploy_key": sub.deploy_key,
        "next_sync_at_ms": sub.next_sync_at_ms,
        "now": tx.now_ms(),
    }
    return tx.run("subscription_insert", params) == 1


def get_subscription(tx: Transaction, project_id: str, name: str) -> Subscription | None:
    row = tx.one("subscription_get", {"project_id": project_id, "name": name})
    return None if row is None else _subscription(row)


def get_subscription_by_id(tx: Transaction, subscription_id: str) -> Subscription | None:
    row = tx.one("subscription_get_by_id", {"id": subscription_id})
    return None if row is None else _subscription(row)


def list_subscriptions(tx: Transaction, project_id: str, *, limit: int) -> list[Subscription]:
    return [_subscription(r) for r in tx.all("subscription_list", {"project_id": project_id, "limit": limit})]


def delete_subscription(tx: Transaction, subscription_id: str) -> None:
    tx.run("subscription_delete", {"id": subscription_id})


def due_subscriptions(tx: Transaction, *, now_ms: int, limit: int) -> list[str]:
    return [row["id"] for row in tx.all("subscription_due", {"now": now_ms, "limit": limit})]


def set_next_sync(tx: Transaction, subscription_id: str, *, expected: int, next_ms: int | None) -> bool:
    """Compare-and-set: False when another replica moved it first."""
    params = {"id": subscription_id, "expected": expected, "next_sync_at_ms": next_ms}
    return tx.run("subscription_set_next", params) == 1


def plaintext_credentials(tx: Transaction, *, limit: int) -> list[tuple[str, str, str, str]]:
    """(id, project id, name, stored text) of subscriptions whose credential is not sealed yet."""
    rows = tx.all("subscription_plaintext_credentials", {"limit": limit})
    return [(r["id"], r["project_id"], r["name"], r["deploy_key"]) for r in rows]


def replace_credential(
    tx: Transaction, subscription_id: str, *, expected: str, credential: str | None
) -> bool:
    params = {"id": subscription_id, "expected": expected, "credential": credential}
    return tx.run("subscription_replace_credential", params) == 1


def insert_sync(
    tx: Transaction, *, sync_id: str, sub: Subscription, trigger_type: str, run_id: str | None = None
) -> None:
    params = {
        "run_id": run_id,
        "id": sync_id,
        "subscription_id": sub.id,
        "project_id": sub.project_id,
        "trigger_type": trigger_type,
        "now": tx.now_ms(),
    }
    tx.run("subscription_sync_insert", params)


def finish_sync(
    tx: Transaction, sync_id: str, *, status: str, commit_sha: str | None, summary: str | None, log: str
) -> bool:
    params = {
        "id": sync_id,
        "status": status,
        "commit_sha": commit_sha,
        "summary": summary,
        "log": log,
        "now": tx.now_ms(),
    }
    return tx.run("subscription_sync_finish", params) == 1


def list_syncs(tx: Transaction, subscription_id: str, *, limit: int) -> list[SubscriptionSync]:
    rows = tx.all("subscription_sync_list", {"subscription_id": subscription_id, "limit": limit})
    return [_sync(row) for row in rows]


def subscription_files(tx: Transaction, subscription_id: str) -> dict[str, str | None]:
    """The paths the subscription wrote, each with the task its header made (None: no task)."""
    rows = tx.all(
        "subscription_file_list", {"subscription_id": subscription_id, "limit": MAX_SCRIPTS_PER_PROJECT}
    )
    return {row["path"]: row["task_id"] for row in rows}


def upsert_subscription_file(tx: Transaction, subscription_id: str, path: str, task_id: str | None) -> None:
    tx.run("subscription_file_upsert", {"subscription_id": subscription_id, "path": path, "task_id": task_id})


def delete_subscription_file(tx: Transaction, subscription_id: str, path: str) -> None:
    tx.run("subscription_file_delete", {"subscription_id": subscription_id, "path": path})


def earliest_due(tx: Transaction) -> int | None:
    row = tx.one("subscription_earliest", {})
    return None if row is None or row["due"] is None else int(row["due"])
