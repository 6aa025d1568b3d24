"""The executor-type placement rule (ADR-0014 §2, docs/dispatch.md "Placement"): a run goes only to a
worker that offers its executor type, the type of its latest attempt, both through the dispatcher and
through the cluster pull; a task whose ``--require executor=...`` conflicts with that type never
starts.

Every task has the ``local_process`` executor today, so the run of another type is written directly
(its attempt's ``executor_type``): the rule must hold for whatever type a run carries."""

from __future__ import annotations

from typing import Any

from ql3.cluster.pull import PullService
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, request, run_of

OTHER = "container"


def _run_of_type(harness: Harness, executor_type: str) -> tuple[Any, str]:
    project, _, (run,) = queued(harness.db)
    harness.db.raw("UPDATE run_attempts SET executor_type = ? WHERE run_id = ?", (executor_type, run.id))
    return project, run.id


def test_a_run_whose_executor_type_no_worker_offers_waits_and_a_worker_of_its_type_takes_it(
    harness: Harness,
) -> None:
    # Given a run of another executor type and a worker that offers only local_process
    register(harness.db, "w-local")
    project, run_id = _run_of_type(harness, OTHER)
    d = dispatcher(harness.db)

    # Then the dispatcher places nothing and says why, and the run waits
    result = d.dispatch_once()
    assert (result.reason, result.offer, result.claim_calls) == ("no_match", None, 0)
    assert result.notes == ((run_id, "no_match"),)  # what `ql3 run show` says of it
    assert run_of(harness.db, project, run_id).status == "queued"

    # When a worker of its type registers, it takes the run (and the local worker still does not)
    register(harness.db, "w-other", executors=(OTHER,))
    result = d.dispatch_once()
    assert result.reason == "claimed" and result.offer is not None
    assert (result.offer.fence.run_id, result.offer.fence.worker_id) == (run_id, "w-other")


def test_the_pull_gives_a_run_only_to_a_worker_of_its_executor_type(harness: Harness) -> None:
    # Given a run of another executor type
    project, run_id = _run_of_type(harness, OTHER)
    local = register(harness.db, "w-local")
    other = register(harness.db, "w-other", executors=("local_process", OTHER))
    service = PullService(harness.db)

    # When the local worker pulls, it gets nothing and the run waits
    result = service.pull_once(request(local))
    assert (result.reason, result.offer) == ("no_match", None)
    assert run_of(harness.db, project, run_id).status == "queued"

    # When the worker that offers its type pulls, it gets the run
    result = service.pull_once(request(other))
    assert result.reason == "claimed" and result.offer is not None
    assert (result.offer.fence.run_id, result.offer.fence.worker_id) == (run_id, "w-other")


def test_a_local_process_run_goes_to_a_local_process_worker_only(harness: Harness) -> None:
    register(harness.db, "w-other", executors=(OTHER,))
    register(harness.db, "w-local")
    queued(harness.db)

    result = dispatcher(harness.db).dispatch_once()

    assert result.offer is not None and result.offer.fence.worker_id == "w-local"


def test_a_required_executor_label_that_conflicts_with_the_runs_type_never_starts(harness: Harness) -> None:
    # Given a worker that offers both types and labels itself with the other one, and a local_process
    # run of a task that requires the other executor: the requirement conflicts with the run's type
    register(harness.db, "w-both", executors=("local_process", OTHER), labels={"executor": OTHER})
    project, _, (run,) = queued(harness.db, require={"executor": OTHER})

    # Then neither the dispatcher nor the pull places it
    result = dispatcher(harness.db).dispatch_once()
    assert (result.reason, result.offer, result.claim_calls) == ("plans_unavailable", None, 0)
    session = register(harness.db, "w-both", executors=("local_process", OTHER), labels={"executor": OTHER})
    pulled = PullService(harness.db).pull_once(request(session))
    assert (pulled.reason, pulled.offer) == ("plans_unavailable", None)
    assert run_of(harness.db, project, run.id).status == "queued"


def test_a_required_executor_label_that_names_the_runs_own_type_is_placed(harness: Harness) -> None:
    register(harness.db, "w1")
    queued(harness.db, require={"executor": "local_process"})

    result = dispatcher(harness.db).dispatch_once()

    assert result.reason == "claimed" and result.offer is not None
