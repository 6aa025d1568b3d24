"""The API's run creation reads the task's current revision once and uses it for everything: the
approval rule, the run's retry policy and its waiting reason (issue 11)."""

from __future__ import annotations

from typing import Any

START = "/api/v1/projects/default/tasks/job/runs"


def _policy(db: Any, run_id: str) -> int | None:
    rows = db.raw("SELECT max_attempts FROM run_retry_policies WHERE run_id = ?", (run_id,))
    return None if not rows else int(rows[0]["max_attempts"])


def test_a_run_gets_the_retry_policy_of_the_revision_current_when_it_started(
    client: Any, owner: Any, make_task: Any, db: Any
) -> None:
    # Given a task whose revision 1 allows three attempts of a command safe to run again
    make_task("job", max_attempts=3, retry_safe=True)
    first = client.post(START, json={}, headers=owner).json()

    # When an edit publishes revision 2 with a single attempt, and another run starts
    edited = client.patch("/api/v1/projects/default/tasks/job", json={"max_attempts": 1}, headers=owner)
    assert edited.status_code == 200, edited.text
    second = client.post(START, json={}, headers=owner).json()

    # Then the first run keeps its three attempts and the second has no retry policy
    assert (first["task_revision"], second["task_revision"]) == (1, 2)
    assert _policy(db, first["id"]) == 3
    assert _policy(db, second["id"]) is None


def test_an_approval_required_revision_still_gets_a_request_and_no_run(
    client: Any, owner: Any, make_task: Any, counts: Any
) -> None:
    # Given a task whose current revision requires approval
    make_task("job")
    edited = client.patch("/api/v1/projects/default/tasks/job", json={"approval": "required"}, headers=owner)
    assert edited.status_code == 200, edited.text
    before = counts()

    # When a run is started
    resp = client.post(START, json={}, headers=owner)

    # Then an approval request answers, and no run was written
    assert resp.status_code == 202, resp.text
    assert "approval" in resp.json()
    assert counts()["runs"] == before["runs"]
