"""A lease holder's ACKs and its own renewals never fence each other: an ACK sent with the version it
held before a renewal committed is applied, and the completion backed by its receipt then succeeds.
On PostgreSQL the race is forced with two real connections: the ACK waits on the lease row lock of an
in-flight renewal, which commits first."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import lease_results, leases
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import FenceConflict
from ql3.domain.offers import LeaseFence
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of
from tests.support.waits import wait_for_lock_waiter

TOKEN = "cb-token"


def _claimed(harness: Harness) -> tuple[Any, LeaseFence]:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return project, offer.fence


def _ack_running(db: Any, fence: LeaseFence) -> Any:
    return db.transaction(
        lambda tx: lease_results.ack_running(
            tx,
            fence,
            pid=4242,
            handle="ql3lp1.race",
            log_artifact_id="log",
            callback_sequence=1,
            callback_token_digest=sha256_hex(TOKEN),
        )
    )


def _complete(db: Any, fence: LeaseFence) -> Any:
    return db.transaction(
        lambda tx: lease_results.complete(tx, fence, callback_sequence=1, callback_token=TOKEN, exit_code=0)
    )


def test_acks_sent_before_a_renewal_committed_are_applied_and_the_run_completes(harness: Harness) -> None:
    # Given a claim; each ACK leaves the worker holding the version it read before a renewal committed
    project, fence = _claimed(harness)
    harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    # When it sends the starting ACK with the pre-renewal version, renews again, then the running ACK
    assert harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))[0] == "starting"
    harness.db.transaction(
        lambda tx: leases.renew(tx, replace(fence, lease_version=fence.lease_version + 1), 30_000)
    )
    assert _ack_running(harness.db, fence)[0] == "running"

    # Then the completion backed by the receipt's token is applied
    assert _complete(harness.db, fence) == ("applied", "succeeded")
    assert run_of(harness.db, project, fence.run_id).status == "succeeded"


def test_a_renewal_still_needs_the_exact_version(harness: Harness) -> None:
    _, fence = _claimed(harness)
    harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    assert err.value.details["reason"] == "version_mismatch"


def test_an_ack_of_another_authority_is_still_fenced(harness: Harness) -> None:
    _, fence = _claimed(harness)
    harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))
    stale = replace(fence, lease_generation=fence.lease_generation + 1)

    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, stale))

    assert err.value.details["reason"] == "lease_generation_mismatch"


def test_a_running_ack_racing_a_renewal_on_two_connections_is_applied(pg_harness: Harness) -> None:
    # PostgreSQL only: SQLite serialises writers, so there the race is the sequential case above.
    harness = pg_harness
    # Given a started attempt whose worker renews on one connection and ACKs on another
    project, fence = _claimed(harness)
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    other = harness.second_connection()
    renewed = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []
    acked: list[Any] = []

    def renew_and_hold(tx: Any) -> None:
        leases.renew(tx, fence, 30_000)  # holds the lease row lock until this transaction commits
        renewed.set()
        assert release.wait(30)

    def renewer() -> None:
        try:
            harness.db.transaction(renew_and_hold)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def acker() -> None:
        try:
            acked.append(_ack_running(other, fence))  # the version it read before the renewal
        except BaseException as exc:
            errors.append(exc)

    t1 = threading.Thread(target=renewer)
    t1.start()
    assert renewed.wait(30)
    t2 = threading.Thread(target=acker)
    t2.start()
    try:
        # When the ACK is blocked on the renewal's row lock and the renewal commits first
        wait_for_lock_waiter(harness.db, what="the ACK to wait on the renewal's lock")
        release.set()
        t1.join(30)
        t2.join(30)
    finally:
        release.set()
        other.close()

    # Then the ACK is applied, and so is the completion of the receipt
    assert errors == [] and [a[0] for a in acked] == ["running"]
    lease = harness.db.raw("SELECT version FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))
    assert int(lease[0]["version"]) == fence.lease_version + 1
    assert _complete(harness.db, fence) == ("applied", "succeeded")
    assert run_of(harness.db, project, fence.run_id).status == "succeeded"
