"""Project variables in offers (docs/variables.md "How runs get them") on both databases: the
embedded dispatcher's and the cluster pull's offers carry the project's variables beside the spec,
a task's own value wins at launch, the spec digest does not cover them (a rebuilt offer keeps its
digest after a change), the offer's JSON for a remote worker carries them and its journaled form
never does."""

from __future__ import annotations

import json
import os

from ql3.application import lease_expiry, variables
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.application.variables import SetVariable, SharedEnvironments
from ql3.cluster.pull import PullService
from ql3.domain.offers import Offer
from ql3.storage.secret_box import AesGcmBox
from tests.support.builders import seed_project
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, queued, register, request, start

BOX = AesGcmBox(os.urandom(32))


def _vars(harness: Harness) -> None:
    project = seed_project(harness.db)
    for item in (
        SetVariable(name="JD_COOKIE", value="pt_key=secret;", secret=True),
        SetVariable(name="REGION", value="project"),
    ):
        harness.db.transaction(lambda tx, item=item: variables.set_variable(tx, project, item, BOX))


def test_a_dispatched_offer_carries_the_variables_and_the_task_value_wins(harness: Harness) -> None:
    register(harness.db)
    _vars(harness)
    queued(harness.db, env={"REGION": "task"})
    shared = SharedEnvironments(harness.db, BOX)
    dispatcher = RunDispatcher(
        harness.db, lease_secret=SECRET, budget=DispatchBudget(), incarnation_started_ms=0, shared=shared
    )

    offer = dispatcher.dispatch_once().offer

    assert offer is not None
    assert offer.spec.launch_environment() == {"JD_COOKIE": "pt_key=secret;", "REGION": "task"}
    # the digest covers the task's own spec only
    assert offer.spec_digest == offer.spec.digest()
    wire = json.loads(offer.to_json())
    assert wire["sharedEnvironment"] == {"JD_COOKIE": "pt_key=secret;", "REGION": "project"}
    assert "pt_key" not in json.dumps(wire["spec"])
    received = Offer.from_json(wire)
    assert received.spec.launch_environment() == offer.spec.launch_environment()
    assert received.spec.digest() == received.spec_digest
    assert "pt_key" not in offer.journaled().to_json()


def test_a_replayed_pull_offer_keeps_its_digest_after_a_variable_changes(harness: Harness) -> None:
    session = register(harness.db, "w1")
    _vars(harness)
    queued(harness.db)
    service = PullService(harness.db, shared=SharedEnvironments(harness.db, BOX, ttl_s=0))

    pull = request(session)  # a retry of the same request: its first response was lost
    first = service.pull(pull, wait_ms=0).offer
    project = seed_project(harness.db)
    harness.db.transaction(
        lambda tx: variables.set_variable(tx, project, SetVariable(name="REGION", value="changed"), BOX)
    )
    again = service.pull(pull, wait_ms=0)

    assert first is not None and again.reason == "replayed" and again.offer is not None
    assert dict(first.spec.shared_environment)["REGION"] == "project"
    assert again.offer.offer_id == first.offer_id
    assert again.offer.spec_digest == first.spec_digest
    assert dict(again.offer.spec.shared_environment)["JD_COOKIE"] == "pt_key=secret;"


def _set_region(harness: Harness, value: str) -> None:
    project = seed_project(harness.db)
    harness.db.transaction(
        lambda tx: variables.set_variable(tx, project, SetVariable(name="REGION", value=value), BOX)
    )


def test_an_attempt_gets_the_values_of_its_dispatch_and_a_retry_the_current_ones(harness: Harness) -> None:
    # Given a retry-safe run queued, and a variable edited while it waits
    register(harness.db, lease_ms=600_000)
    _vars(harness)
    queued(harness.db, max_attempts=2, retry_safe=True)
    _set_region(harness, "edited-while-queued")
    shared = SharedEnvironments(harness.db, BOX, ttl_s=0)

    def dispatch() -> Offer:
        d = RunDispatcher(
            harness.db, lease_secret=SECRET, budget=DispatchBudget(), incarnation_started_ms=0, shared=shared
        )
        offer = d.dispatch_once().offer
        assert offer is not None
        return offer

    # When it is dispatched, the edit has reached it
    first = dispatch()
    assert dict(first.spec.shared_environment)["REGION"] == "edited-while-queued"

    # And when it runs, the variable changes again and the attempt is lost, its retry (a new attempt)
    # takes the value current at its own dispatch
    start(harness.db, first)
    _set_region(harness, "edited-while-running")
    harness.advance_clock(30_001)
    harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, first.fence.attempt_id))
    harness.advance_clock(3_600_000)
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, first.fence.run_id)) is not None
    register(harness.db, lease_ms=600_000)
    retry = dispatch()
    assert retry.fence.run_id == first.fence.run_id and retry.fence.attempt_id != first.fence.attempt_id
    assert dict(retry.spec.shared_environment) == {
        "JD_COOKIE": "pt_key=secret;",
        "REGION": "edited-while-running",
    }
