"""Project variables over HTTP (docs/variables.md): secrets are write-only, plain values only for the
roles that may see commands, bad input 422 with nothing written, import all or none, and no key for
secrets answers 503 ``secrets_unavailable``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.http.app import create_app
from ql3.storage.secret_box import AesGcmBox
from ql3.storage.sqlite.adapter import SqliteDatabase

VARS = "/api/v1/projects/default/variables"
SECRET_VALUE = "pt_key=AAAA-secret-BBBB;"


@pytest.fixture
def vclient(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(db, secret_box=AesGcmBox(os.urandom(32)))) as test_client:
        yield test_client


def test_a_secret_is_never_answered_and_a_plain_value_only_to_editors(
    vclient: Any, owner: Any, make_token: Any
) -> None:
    viewer = make_token("viewer")

    put_secret = vclient.put(
        f"{VARS}/JD_COOKIE", json={"value": SECRET_VALUE, "secret": True, "note": "账号一"}, headers=owner
    )
    put_plain = vclient.put(f"{VARS}/REGION", json={"value": "cn"}, headers=owner)
    as_owner = vclient.get(VARS, headers=owner)
    as_viewer = vclient.get(VARS, headers=viewer)

    assert put_secret.status_code == 200, put_secret.text
    assert put_secret.json()["value"] is None and put_secret.json()["secret"] is True
    assert put_plain.json()["value"] == "cn"
    assert [(v["name"], v["value"]) for v in as_owner.json()["items"]] == [
        ("JD_COOKIE", None),
        ("REGION", "cn"),
    ]
    assert [v["value"] for v in as_viewer.json()["items"]] == [None, None]
    for resp in (put_secret, put_plain, as_owner, as_viewer):
        assert SECRET_VALUE not in resp.text
    assert vclient.put(f"{VARS}/X", json={"value": "1"}, headers=viewer).status_code == 403


def test_bad_input_gets_422_and_writes_nothing(vclient: Any, owner: Any, counts: Any) -> None:
    before = counts()

    answers = [
        vclient.put(f"{VARS}/1BAD", json={"value": "x"}, headers=owner),
        vclient.put(f"{VARS}/OK", json={"value": "x" * (64 * 1024 + 1)}, headers=owner),
        vclient.put(f"{VARS}/OK", json={"value": "x", "note": "bell\u0007"}, headers=owner),
        vclient.post(VARS, json={"text": "A=1\nnot a line\n"}, headers=owner),
        vclient.post(VARS, json={"text": '[{"name": "A", "value": 1}]'}, headers=owner),
    ]

    for resp in answers:
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["code"] == "validation_failed"
    assert "line 2" in answers[3].json()["error"]["message"]
    assert vclient.get(VARS, headers=owner).json()["items"] == []
    assert counts() == before


def test_import_takes_key_value_lines_and_a_qinglong_export(vclient: Any, owner: Any) -> None:
    lines = vclient.post(
        VARS,
        json={"text": "# comment\nexport A='1'\nB=\"two words\"\n", "secret": True},
        headers=owner,
    )
    qinglong = vclient.post(
        VARS,
        json={"text": '[{"name": "C", "value": "3", "remarks": "备注", "status": 1}]'},
        headers=owner,
    )
    listed = vclient.get(VARS, headers=owner).json()["items"]

    assert lines.json() == {"imported": 2, "names": ["A", "B"]}
    assert qinglong.json() == {"imported": 1, "names": ["C"]}
    assert [(v["name"], v["secret"], v["enabled"], v["note"]) for v in listed] == [
        ("A", True, True, ""),
        ("B", True, True, ""),
        ("C", False, False, "备注"),
    ]


def test_remove_then_remove_again_is_404(vclient: Any, owner: Any) -> None:
    vclient.put(f"{VARS}/GONE", json={"value": "x"}, headers=owner)

    first = vclient.delete(f"{VARS}/GONE", headers=owner)
    second = vclient.delete(f"{VARS}/GONE", headers=owner)

    assert (first.status_code, second.status_code) == (204, 404)


def test_without_a_key_secrets_are_refused_and_plain_variables_work(client: Any, owner: Any) -> None:
    secret = client.put(f"{VARS}/S", json={"value": "x", "secret": True}, headers=owner)
    plain = client.put(f"{VARS}/P", json={"value": "x"}, headers=owner)

    assert secret.status_code == 503 and secret.json()["error"]["code"] == "secrets_unavailable"
    assert plain.status_code == 200
