"""What the console's admin pages read beyond the CLI's calls: the delivery history of a project
(newest first, keyset-paged, project-scoped, admin only) and the online backup download (SQLite: a
consistent, valid ql3 database file, owner only and logged; PostgreSQL: refused with a stable code).
Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application import auth, notifications
from ql3.domain.egress import EgressPolicy
from ql3.http.app import create_app
from ql3.ports.storage import Transaction
from tests.support.builders import seed_project
from tests.support.databases import Harness

BASE = "/api/v1/projects/{}/notifications"


def _owner(harness: Harness) -> dict[str, str]:
    def unit(tx: Transaction) -> str:
        issued = auth.bootstrap_owner(tx)
        assert issued is not None
        return issued.token

    return {"Authorization": f"Bearer {harness.db.transaction(unit)}"}


def _member(harness: Harness, role: str, project: str = "default") -> dict[str, str]:
    def unit(tx: Transaction) -> str:
        found = auth.resolve_project(tx, project)
        return auth.issue_token(tx, name=f"m-{role}", role=role, project=found).token

    return {"Authorization": f"Bearer {harness.db.transaction(unit)}"}


def _channel(harness: Harness, project_name: str, name: str) -> None:
    project = seed_project(harness.db, project_name)
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name=name,
            kind="webhook",
            url="https://example.invalid/h",
            secret="s3cret-for-the-webhook-0123456789",
            egress=EgressPolicy(),
        )
    )


def test_delivery_history_pages_newest_first_within_the_project(harness: Harness) -> None:
    owner = _owner(harness)
    _channel(harness, "default", "ops")
    _channel(harness, "other", "theirs")
    with TestClient(create_app(harness.db)) as client:
        sent = [client.post(BASE.format("default") + "/channels/ops/test", headers=owner) for _ in range(5)]
        assert all(r.status_code == 202 for r in sent)
        theirs = client.post(BASE.format("other") + "/channels/theirs/test", headers=owner)
        assert theirs.status_code == 202

        # Given 5 test messages: two pages of 2 and one of 1, newest first, each once, none of "other"
        seen: list[dict[str, Any]] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = client.get(BASE.format("default") + "/deliveries", params=params, headers=owner)
            assert page.status_code == 200, page.text
            body = page.json()
            seen.extend(body["items"])
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None or pages > 5:
                break
        ids = [d["id"] for d in seen]
        assert sorted(ids) == sorted(r.json()["id"] for r in sent)
        assert len(set(ids)) == 5
        keys = [(d["created_at_ms"], d["id"]) for d in seen]
        assert keys == sorted(keys, reverse=True)
        assert {d["channel"] for d in seen} == {"ops"}
        assert {d["event"] for d in seen} == {"test"}
        assert theirs.json()["id"] not in ids

        # The other project sees its own message only; removing the channel drops it (never sent)
        other_url = BASE.format("other") + "/deliveries"
        assert [d["id"] for d in client.get(other_url, headers=owner).json()["items"]] == [
            theirs.json()["id"]
        ]
        client.delete(BASE.format("other") + "/channels/theirs", headers=owner)
        assert client.get(other_url, headers=owner).json() == {"items": [], "next_cursor": None}


def test_delivery_history_refuses_bad_cursors_and_non_admins(harness: Harness) -> None:
    owner = _owner(harness)
    operator = _member(harness, "operator")
    with TestClient(create_app(harness.db)) as client:
        url = BASE.format("default") + "/deliveries"
        for bad in ("x", "12", "12.", ".abc", "99999999999999999999.a"):
            answer = client.get(url, params={"cursor": bad}, headers=owner)
            assert answer.status_code == 422, bad
            assert answer.json()["error"]["code"] == "validation_failed"
        assert client.get(url, params={"limit": 0}, headers=owner).status_code == 422
        assert client.get(url, params={"limit": 201}, headers=owner).status_code == 422
        refused = client.get(url, headers=operator)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"


def test_backup_download_is_a_valid_database_for_the_owner_only(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    owner = _owner(harness)
    admin = _member(harness, "admin")
    with TestClient(create_app(harness.db)) as client:
        refused = client.get("/api/v1/backup", headers=admin)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert client.get("/api/v1/backup").status_code == 401

        with caplog.at_level(logging.INFO, logger="ql3.audit"):
            answer = client.get("/api/v1/backup", headers=owner)
        if harness.dialect == "postgres":
            assert answer.status_code == 409
            assert answer.json()["error"]["code"] == "backup_not_supported"
            assert "pg_dump" in answer.json()["error"]["message"]
            assert not [r for r in caplog.records if r.name == "ql3.audit"]
            return
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/vnd.sqlite3"
        assert "attachment" in answer.headers["content-disposition"]
        assert answer.headers["cache-control"] == "no-store"
        copy = tmp_path / "copy.db"
        copy.write_bytes(answer.content)
        assert answer.content[:16] == b"SQLite format 3\x00"
        conn = sqlite3.connect(copy)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
            names = {r[0] for r in conn.execute("SELECT name FROM principals")}
            assert {"owner", "m-admin"} <= names
        finally:
            conn.close()
        # Logged with who took it, and no temporary copy is left next to the database
        audit = [r for r in caplog.records if r.name == "ql3.audit"]
        assert len(audit) == 1
        assert audit[0].__dict__["action"] == "backup.download"
        assert audit[0].__dict__["bytes"] == len(answer.content)
        db_dir = Path(str(harness.db.path)).parent
        assert not list(db_dir.glob(".ql3-backup-*"))
