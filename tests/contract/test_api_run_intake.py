"""``POST /api/v1/projects/{p}/tasks/{t}/runs`` on its fast path (ql3/http/run_intake.py), on both
databases: one transaction and a bounded number of named statements per run, the token still checked
against the database state in that transaction (revoked, expired, worker credentials refused, the use
recorded), and every answer the same as the framework's route gives (the fast path switched off)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from fastapi import FastAPI
from starlette.exceptions import StarletteDeprecationWarning

from ql3.application import auth, tasks, worker_credentials
from ql3.http import run_intake
from ql3.http.app import create_app
from ql3.http.run_intake import ROUTE_PATH, StartRunFastPath
from ql3.ports.storage import Transaction
from tests.support.databases import Harness

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

RUNS = "/api/v1/projects/default/tasks/t/runs"
# The create unit's named statements, as a member (not the owner) of the project: the token's
# principal, one read of the project, the role binding, the task and its current revision
# (run_create_target; they were four), the run, its attempt, the run read back, the two events, the
# response's describe and the workers of its waiting reason.
STATEMENTS_PER_API_RUN = 9


class CountingDb:
    """The database with its transactions and each transaction's named statements counted."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.transactions = 0
        self.writes = 0
        self.statements: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def transaction(self, fn: Callable[[Transaction], Any], *, write: bool = True) -> Any:
        self.transactions += 1
        self.writes += write
        return self._db.transaction(lambda tx: fn(_CountingTx(tx, self.statements)), write=write)


class _CountingTx:
    def __init__(self, tx: Transaction, statements: list[str]) -> None:
        self._tx = tx
        self._statements = statements

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._tx, name)
        if name not in ("one", "all", "run"):
            return found

        def counted(query: str, *args: Any, **kwargs: Any) -> Any:
            self._statements.append(query)
            return found(query, *args, **kwargs)

        return counted


def _without_fast_path(app: FastAPI) -> FastAPI:
    kept = [m for m in app.user_middleware if getattr(m, "cls", None) is not cast(Any, StartRunFastPath)]
    app.user_middleware = kept
    return app


@pytest.fixture
def owner(harness: Harness) -> auth.IssuedToken:
    def unit(tx: Transaction) -> auth.IssuedToken:
        issued = auth.bootstrap_owner(tx)
        assert issued is not None
        tasks.create_task(tx, issued.project.id, "t", {"command": "true"})
        tasks.create_task(tx, issued.project.id, "gated", {"command": "true", "approval": "required"})
        return issued

    issued: auth.IssuedToken = harness.db.transaction(unit)
    return issued


@pytest.fixture
def member(harness: Harness, owner: auth.IssuedToken) -> auth.IssuedToken:
    issued: auth.IssuedToken = harness.db.transaction(
        lambda tx: auth.issue_token(tx, name="member", role="operator", project=owner.project)
    )
    return issued


@pytest.fixture
def counting(harness: Harness) -> CountingDb:
    return CountingDb(harness.db)


@pytest.fixture
def client(counting: CountingDb) -> Iterator[TestClient]:
    with TestClient(create_app(counting)) as c:
        yield c


@pytest.fixture
def route_client(harness: Harness) -> Iterator[TestClient]:
    with TestClient(_without_fast_path(create_app(harness.db))) as c:
        yield c


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _runs(harness: Harness) -> int:
    return int(harness.db.raw("SELECT count(*) AS n FROM runs")[0]["n"])


def test_the_path_it_answers_for_is_the_routes(client: TestClient) -> None:
    app: Any = client.app
    assert "post" in app.openapi()["paths"][ROUTE_PATH]


def test_one_run_is_one_transaction_of_a_bounded_number_of_statements(
    client: TestClient, counting: CountingDb, member: auth.IssuedToken
) -> None:
    # Given a member whose token's use is already recorded
    assert client.post(RUNS, json={}, headers=_h(member.token)).status_code == 201

    # When it starts one more run
    counting.transactions, counting.statements[:] = 0, []
    response = client.post(RUNS, json={}, headers=_h(member.token))

    # Then the token check and the create were one transaction, within the statement budget
    assert response.status_code == 201
    assert counting.transactions == 1
    assert counting.statements[0] == "principal_by_digest"  # the token is checked first
    assert len(counting.statements) <= STATEMENTS_PER_API_RUN, counting.statements


def test_a_revoked_token_is_refused_on_the_next_request(
    client: TestClient, harness: Harness, owner: auth.IssuedToken, member: auth.IssuedToken
) -> None:
    assert client.post(RUNS, json={}, headers=_h(member.token)).status_code == 201
    harness.db.transaction(
        lambda tx: auth.revoke_token(tx, owner.principal, owner.project, member.principal.id)
    )

    refused = client.post(RUNS, json={}, headers=_h(member.token))

    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthenticated"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert _runs(harness) == 1


def test_an_expired_token_is_refused(client: TestClient, harness: Harness, owner: auth.IssuedToken) -> None:
    issued = harness.db.transaction(
        lambda tx: auth.issue_token(tx, name="brief", role="operator", project=owner.project, expires_in_s=60)
    )
    assert client.post(RUNS, json={}, headers=_h(issued.token)).status_code == 201
    harness.advance_clock(60_001)

    refused = client.post(RUNS, json={}, headers=_h(issued.token))

    assert refused.status_code == 401
    assert _runs(harness) == 1


def test_an_unknown_token_and_a_worker_credential_are_refused(
    client: TestClient, harness: Harness, owner: auth.IssuedToken
) -> None:
    worker = harness.db.transaction(lambda tx: worker_credentials.issue(tx, "w1"))

    unknown = client.post(RUNS, json={}, headers=_h("ql3_" + "x" * 40))
    as_worker = client.post(RUNS, json={}, headers=_h(worker.token))

    assert unknown.status_code == 401
    assert as_worker.status_code == 403
    assert as_worker.json()["error"]["code"] == "permission_denied"
    assert _runs(harness) == 0


def test_a_wrong_token_is_refused_without_a_write_transaction(
    client: TestClient, counting: CountingDb, harness: Harness, owner: auth.IssuedToken
) -> None:
    # Given a well-formed token that matches no principal, sent twice
    counting.transactions, counting.writes = 0, 0
    answers = [client.post(RUNS, json={}, headers=_h("ql3_" + "y" * 40)) for _ in range(2)]

    # Then both are refused from a read transaction each: nothing took the write lock
    assert [a.status_code for a in answers] == [401, 401]
    assert (counting.transactions, counting.writes) == (2, 0)
    assert _runs(harness) == 0


def test_a_first_request_is_checked_in_a_read_then_one_write_and_a_revoked_token_leaves_the_fast_way(
    client: TestClient,
    counting: CountingDb,
    harness: Harness,
    owner: auth.IssuedToken,
    member: auth.IssuedToken,
) -> None:
    def post(token: str) -> tuple[int, int, int]:
        """(status, transactions, write transactions) of one request."""
        counting.transactions, counting.writes = 0, 0
        status = client.post(RUNS, json={}, headers=_h(token)).status_code
        return status, counting.transactions, counting.writes

    # A token not seen here yet: a read check, then the write unit (which checks it again); seen: one
    # write transaction only
    assert [post(member.token) for _ in range(2)] == [(201, 2, 1), (201, 1, 1)]

    # Revoked: refused by the write unit's own check once, then from a read without the write lock
    harness.db.transaction(
        lambda tx: auth.revoke_token(tx, owner.principal, owner.project, member.principal.id)
    )
    assert [post(member.token) for _ in range(2)] == [(401, 1, 1), (401, 1, 0)]
    assert _runs(harness) == 2


def test_the_set_of_seen_tokens_is_bounded_least_recently_used_first_out(
    client: TestClient,
    counting: CountingDb,
    owner: auth.IssuedToken,
    member: auth.IssuedToken,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_intake, "KNOWN_TOKENS_MAX", 1)
    for token in (member.token, owner.token):  # the owner's token pushes the member's out
        assert client.post(RUNS, json={}, headers=_h(token)).status_code == 201

    counting.transactions = 0
    assert client.post(RUNS, json={}, headers=_h(member.token)).status_code == 201
    assert counting.transactions == 2  # checked in a read again


def test_a_token_used_again_is_the_last_to_leave_the_set(
    client: TestClient,
    counting: CountingDb,
    harness: Harness,
    owner: auth.IssuedToken,
    member: auth.IssuedToken,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    third = harness.db.transaction(
        lambda tx: auth.issue_token(tx, name="third", role="operator", project=owner.project)
    )
    monkeypatch.setattr(run_intake, "KNOWN_TOKENS_MAX", 2)
    for token in (member.token, owner.token, member.token, third.token):  # the owner's is the oldest
        assert client.post(RUNS, json={}, headers=_h(token)).status_code == 201

    counting.transactions = 0
    assert client.post(RUNS, json={}, headers=_h(member.token)).status_code == 201
    assert counting.transactions == 1  # still seen
    assert client.post(RUNS, json={}, headers=_h(owner.token)).status_code == 201
    assert counting.transactions == 3  # pushed out: checked in a read again


def test_the_tokens_use_is_recorded(
    client: TestClient, harness: Harness, owner: auth.IssuedToken, member: auth.IssuedToken
) -> None:
    def last_used() -> int | None:
        listed: list[auth.TokenRecord] = harness.db.transaction(
            lambda tx: auth.list_tokens(tx, owner.project), write=False
        )
        return next(r.last_used_at_ms for r in listed if r.id == member.principal.id)

    assert last_used() is None

    assert client.post(RUNS, json={}, headers=_h(member.token)).status_code == 201

    assert last_used() is not None


def test_a_created_run_reads_back_byte_for_byte_as_the_runs_route_serves_it(
    client: TestClient, member: auth.IssuedToken
) -> None:
    created = client.post(RUNS, json={"priority": 3}, headers=_h(member.token))
    assert created.status_code == 201

    shown = client.get(f"/api/v1/projects/default/runs/{created.json()['id']}", headers=_h(member.token))

    assert created.content == shown.content
    assert {k: v for k, v in created.headers.items() if k != "content-length"} == {
        k: v for k, v in shown.headers.items() if k != "content-length"
    }


def _masked(body: Any) -> Any:
    """An answer with what differs between two runs (ids, times) replaced by its type."""
    if isinstance(body, dict):
        return {
            k: type(v).__name__ if k.endswith(("id", "_ms")) or k == "idempotency_key" else _masked(v)
            for k, v in body.items()
        }
    if isinstance(body, list):
        return [_masked(v) for v in body]
    return body


# (token: None, the member's, a made-up one; content type; body bytes)
CASES: list[tuple[str, str | None, bytes]] = [
    ("member", "application/json", b"{}"),
    ("member", None, b""),
    ("member", "application/json; charset=utf-8", b'{"priority": -4}'),
    ("member", "application/json", b'{"idempotency_key": "KEY"}'),
    ("member", "application/json", b'{"idempotency_key": "KEY"}'),  # the repeat: 200
    ("member", "application/json", b'{"rerun_of": "00000000-0000-4000-8000-000000000000"}'),
    ("member", "application/json", b'{"priority": 2147483648}'),
    ("member", "application/json", b'{"unknown": 1}'),
    ("member", "application/json", b'{"priority": "1"}'),
    ("member", "application/json", b"[]"),
    ("member", "application/json", b"null"),
    ("member", "application/json", b"{"),
    ("member", "application/json", b"\xff"),
    ("member", "text/plain", b"{}"),
    ("member", None, b"{}"),
    ("owner", "application/json", b"{}"),
    ("viewer", "application/json", b"{}"),
    ("outsider", "application/json", b"{}"),
    ("viewer", "application/json", b'{"unknown": 1}'),
    ("none", "application/json", b"{}"),
    ("none", "application/json", b'{"unknown": 1}'),
    ("none", "application/json", b"{"),
    ("bad", "application/json", b"{}"),
    ("bad", "application/json", b'{"priority": "x"}'),
]


@pytest.fixture
def tokens(harness: Harness, owner: auth.IssuedToken, member: auth.IssuedToken) -> dict[str, dict[str, str]]:
    """Request headers of each kind of caller."""

    def unit(tx: Transaction) -> tuple[str, str]:
        viewer = auth.issue_token(tx, name="viewer", role="viewer", project=owner.project)
        other = auth.create_project(tx, "other")
        outsider = auth.issue_token(tx, name="outsider", role="admin", project=other)
        return viewer.token, outsider.token

    viewer, outsider = harness.db.transaction(unit)
    return {
        "owner": _h(owner.token),
        "member": _h(member.token),
        "viewer": _h(viewer),
        "outsider": _h(outsider),
        "bad": _h("ql3_" + "y" * 40),
        "none": {},
    }


def _target(harness: Harness, owner: auth.IssuedToken, name: str) -> str:
    """The path of one kind of target: a task by name or id, a deleted one, a missing one."""

    def unit(tx: Transaction) -> str:
        project = owner.project
        if name == "by-id":
            return f"/api/v1/projects/{project.id}/tasks/{tasks.find_task(tx, project.id, 't').id}/runs"
        if name == "deleted":
            tasks.create_task(tx, project.id, "gone", {"command": "true"})
            tasks.delete_task(tx, project.id, "gone")
            return "/api/v1/projects/default/tasks/gone/runs"
        if name == "disabled":
            tasks.create_task(tx, project.id, "off", {"command": "true"})
            tasks.set_enabled(tx, project.id, "off", False)
            return "/api/v1/projects/default/tasks/off/runs"
        if name == "nope-project":
            return "/api/v1/projects/nope/tasks/t/runs"
        return f"/api/v1/projects/default/tasks/{name}/runs"

    path: str = harness.db.transaction(unit)
    return path


@pytest.mark.parametrize("target", ["t", "by-id", "gated", "nope", "deleted", "disabled", "nope-project"])
def test_every_answer_is_the_routes_answer(
    client: TestClient,
    route_client: TestClient,
    harness: Harness,
    owner: auth.IssuedToken,
    tokens: dict[str, dict[str, str]],
    target: str,
) -> None:
    path = _target(harness, owner, target)
    answers: list[list[Any]] = []
    for c, tag in ((client, b"fast"), (route_client, b"route")):
        seen = []
        for who, content_type, template in CASES:
            body = template.replace(b"KEY", tag)  # each side's idempotency keys of its own
            headers = tokens[who]
            if content_type is not None:
                headers = {**headers, "Content-Type": content_type}
            response = c.post(path, content=body, headers=headers)
            seen.append(
                [
                    response.status_code,
                    _masked(json.loads(response.content)),
                    sorted((k, v) for k, v in response.headers.items() if k != "content-length"),
                ]
            )
        answers.append(seen)
    fast, route = answers
    for case, (a, b) in zip(CASES, zip(fast, route, strict=True), strict=True):
        assert a == b, case
