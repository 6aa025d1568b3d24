"""The API's run creation on PostgreSQL costs a bounded number of round trips (issue 11): one unit,
the token check first in it, as a member (not the owner) of the project calls it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ql3.application import auth, tasks
from ql3.http.app import create_app
from ql3.ports.storage import Transaction
from tests.support.databases import Harness
from tests.support.round_trips import count_round_trips

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

# One unit (ql3/http/run_intake.py): the token check, one read of the project, the role binding, the
# task and its current revision (run_create_target: its approval rule, its retry policy and its
# placement), the run, its attempt, the run read back, the events, the response's describe and the
# workers of its waiting reason, with BEGIN, the clock and COMMIT. Was 17: the revision was read three
# times and the task's schedule once; 14 with the token check in a read unit of its own and the four
# reads apart; 13 with the token check in the unit.
ROUND_TRIPS_PER_API_RUN = 10


@pytest.fixture
def member(pg_harness: Harness) -> str:
    def unit(tx: Transaction) -> str:
        owner = auth.bootstrap_owner(tx)
        assert owner is not None
        tasks.create_task(tx, owner.project.id, "t", {"command": "true"})
        return auth.issue_token(tx, name="member", role="operator", project=owner.project).token

    token: str = pg_harness.db.transaction(unit)
    return token


@pytest.fixture
def client(pg_harness: Harness, member: str) -> Iterator[TestClient]:
    with TestClient(create_app(pg_harness.db), headers={"Authorization": f"Bearer {member}"}) as c:
        yield c


def test_one_api_run_creation_costs_a_bounded_number_of_round_trips(client: TestClient) -> None:
    # Given a member's token already used (its last use recorded) and the statements prepared
    for _ in range(6):
        assert client.post("/api/v1/projects/default/tasks/t/runs", json={}).status_code == 201

    # When it starts one more run
    with count_round_trips() as round_trips:
        response = client.post("/api/v1/projects/default/tasks/t/runs", json={})

    # Then the run was created in at most the budgeted exchanges with the server
    assert response.status_code == 201
    assert response.json()["waiting_reason"] == "no_worker"
    assert round_trips[0] <= ROUND_TRIPS_PER_API_RUN, round_trips[0]
