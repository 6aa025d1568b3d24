"""``ql3 user``: add (password from stdin), list, passwd, totp, sessions, revoke-session, rm, against the
app in-process; bad input exits 64 and writes nothing (docs/security.md "Console sign-in")."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application import sessions
from ql3.storage.secret_box import AesGcmBox

PASSWORD = "correct horse battery"


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))


def _json(cli_main: Any, *args: str) -> Any:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, (args, err)
    return json.loads(out)


def _sign_in(client: TestClient, password: str = PASSWORD, **extra: Any) -> Any:
    return client.post("/api/v1/session", json={"name": "alice", "password": password, **extra})


def test_a_user_is_added_signs_in_and_is_managed(
    cli_main: Any, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.app.state.secret_box = AesGcmBox(os.urandom(32))  # type: ignore[attr-defined]
    _stdin(monkeypatch, PASSWORD + "\n")
    added = _json(cli_main, "user", "add", "alice", "--role", "operator")
    assert added["name"] == "alice" and added["totp"] is False
    assert _sign_in(client).status_code == 200
    assert [u["name"] for u in _json(cli_main, "user", "list")["items"]] == ["alice"]

    listed = _json(cli_main, "user", "sessions", "alice")["items"]
    assert len(listed) == 1
    code, out, _ = cli_main("user", "revoke-session", listed[0]["id"])
    assert code == 0 and "revoked" in out
    assert client.get("/api/v1/whoami").status_code == 401
    assert _json(cli_main, "user", "sessions", "alice")["items"] == []

    _stdin(monkeypatch, "a new password\n")
    assert _json(cli_main, "user", "passwd", "alice") == {"sessions_revoked": 0}
    assert _sign_in(client).status_code == 401
    assert _sign_in(client, "a new password").status_code == 200

    code, out, _ = cli_main("user", "totp", "enable", "alice")
    assert code == 0 and "otpauth://totp/ql3:alice?secret=" in out
    secret = out.split("secret: ")[1].strip()
    client.cookies.clear()
    assert _sign_in(client, "a new password").json()["error"]["code"] == "totp_required"
    step = int(client.app.state.db.transaction(lambda tx: tx.now_ms(), write=False)) // 30_000  # type: ignore[attr-defined]
    assert _sign_in(client, "a new password", totp=sessions.totp_code(secret, step)).status_code == 200
    assert _json(cli_main, "user", "totp", "disable", "alice") == {"name": "alice", "totp": False}

    assert _json(cli_main, "user", "rm", "alice") == {"sessions_revoked": 2}  # both sign-ins above
    assert _json(cli_main, "user", "list")["items"] == []


def test_bad_input_exits_64_and_writes_nothing(cli_main: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _stdin(monkeypatch, "short\n")
    code, _, err = cli_main("user", "add", "alice")
    assert code == 64 and "invalid_password" in err
    code, _, _ = cli_main("user", "add", "alice", "--role", "boss")
    assert code == 64
    _stdin(monkeypatch, PASSWORD + "\n")
    code, _, err = cli_main("user", "add", "bad/name")
    assert code == 64, err
    assert _json(cli_main, "user", "list")["items"] == []
    _stdin(monkeypatch, PASSWORD + "\n")
    code, _, err = cli_main("user", "passwd", "nobody")
    assert code != 0 and "not_found" in err
