"""The Run states with no process that no path of today's product commits, set by hand as a repair or an
older version would leave them: a ``created`` Run with no attempt yet, a ``lost`` Run between attempts, a
live Run with an intent whose attempt row is gone. A cancel intent still ends the first two in its own
transaction (docs/contracts.md §4.1), and a claim on the third fails closed (§4.2) while the supervisor
skips it, naming why."""

from __future__ import annotations

import pytest

from ql3.application import cancellation, lease_expiry
from ql3.application.cancellation_supervisor import CancellationSupervisor
from tests.support.builders import count
from tests.support.cancellation_builders import FakeSignal, claim, events, request
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, start


def _run(harness: Harness, run_id: str) -> dict[str, object]:
    return dict(harness.db.raw("SELECT * FROM runs WHERE id = ?", (run_id,))[0])


def _without_attempts(harness: Harness, run_id: str) -> None:
    harness.db.raw("DELETE FROM run_attempts WHERE run_id = ?", (run_id,))


def test_a_created_run_without_an_attempt_is_cancelled_in_the_intents_transaction(harness: Harness) -> None:
    # Given a created run that has no attempt yet
    register(harness.db)
    project, _, (run,) = queued(harness.db)
    _without_attempts(harness, run.id)
    harness.db.raw("UPDATE runs SET status = 'created' WHERE id = ?", (run.id,))

    # When it is cancelled
    assert request(harness.db, project, run.id) == "requested"

    # Then it ended at once, with no attempt to name and no dispatch to claim
    assert _run(harness, run.id)["status"] == "cancelled"
    tail = events(harness.db, run.id)[-2:]
    assert [(e["type"], e["attempt_id"]) for e in tail] == [
        ("run.cancel_requested", None),
        ("run.cancelled", None),
    ]
    assert tail[1]["payload"] == {"from": "created", "to": "cancelled"}
    assert count(harness.db, "run_attempts") == 0 and count(harness.db, "cancellation_dispatches") == 0


@pytest.mark.parametrize("reason", ["user", "timeout"])
def test_a_lost_run_between_attempts_is_cancelled_in_the_intents_transaction(
    harness: Harness, reason: str
) -> None:
    # Given a run whose attempt was lost and that waits, lost, for what follows
    register(harness.db, lease_ms=600_000)
    project, _, (run,) = queued(harness.db, max_attempts=2, retry_safe=True)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer)
    assert harness.db.transaction(
        lambda tx: lease_expiry.mark_lost(tx, run.id, offer.fence.attempt_id, error_code="X")
    )
    harness.db.raw("UPDATE runs SET status = 'lost' WHERE id = ?", (run.id,))

    # When it is cancelled (for a timeout too: lost -> timed_out is not a transition)
    assert request(harness.db, project, run.id, reason=reason) == "requested"

    # Then the run is cancelled at once and its lost attempt is left as it was
    ended = _run(harness, run.id)
    assert (ended["status"], ended["error_code"]) == ("cancelled", "EXECUTION_CANCELLED")
    attempts = harness.db.raw("SELECT status FROM run_attempts WHERE run_id = ?", (run.id,))
    assert [a["status"] for a in attempts] == ["lost"]
    assert [e["type"] for e in events(harness.db, run.id)][-2:] == ["run.cancel_requested", "run.cancelled"]
    assert count(harness.db, "cancellation_dispatches") == 0


def test_a_claim_for_a_live_run_with_an_intent_and_no_attempt_is_not_eligible(harness: Harness) -> None:
    # Given a queued run with a committed intent whose attempt row is gone
    register(harness.db)
    _, _, (run,) = queued(harness.db)
    _without_attempts(harness, run.id)
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = 1, cancel_reason = 'user' WHERE id = ?", (run.id,)
    )

    outcome = claim(harness.db, run.id, owner="sup-a")

    # Then nothing is leased: the answer names the run and carries nothing else
    assert outcome == cancellation.DispatchClaim(status="not_eligible", run_id=run.id)
    assert count(harness.db, "cancellation_dispatches") == 0


def test_the_supervisor_skips_a_live_run_with_an_intent_and_no_attempt_without_a_signal(
    harness: Harness,
) -> None:
    # Given a queued run with a committed intent whose attempt row is gone
    register(harness.db)
    _, _, (run,) = queued(harness.db)
    _without_attempts(harness, run.id)
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = 1, cancel_reason = 'user' WHERE id = ?", (run.id,)
    )
    signal = FakeSignal()

    report = CancellationSupervisor(harness.db, signal=signal, owner="sup-a").run_cycle()

    # Then the cycle names why it left the run alone, and nothing was claimed or signalled
    assert (report.scanned, report.claimed, report.skipped, signal.calls) == (1, 0, {"no_attempt": 1}, [])
    assert count(harness.db, "cancellation_dispatches") == 0
