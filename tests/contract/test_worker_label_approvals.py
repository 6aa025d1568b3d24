"""A worker credential is bound to its worker's labels, on both databases (docs/security.md "A remote
worker"): the first registration over the worker API binds them, other labels are refused with
nothing registered, and an admin's approval or a credential minted with labels changes them."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import worker_credentials, worker_labels
from ql3.application.gateway import InProcessControlPlane
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.ids import new_id
from ql3.ports.control_plane import SessionInfo
from tests.support.builders import count
from tests.support.databases import Harness

ADMIN = "admin-principal-id"


def _register(harness: Harness, worker_id: str, labels: dict[str, str], *, bound: bool = True) -> SessionInfo:
    caps: dict[str, Any] = {"executors": ["local_process"], "labels": labels}
    return InProcessControlPlane(harness.db).register(
        worker_id=worker_id,
        session_id=new_id(),
        capabilities=caps,
        max_concurrent_runs=2,
        session_lease_ms=30_000,
        approved_labels_only=bound,
    )


def _approval(harness: Harness, worker_id: str) -> worker_labels.LabelApproval:
    approval: worker_labels.LabelApproval = harness.db.transaction(
        lambda tx: worker_labels.get(tx, worker_id), write=False
    )
    return approval


def test_the_first_registration_binds_the_labels_and_others_are_refused_with_nothing_written(
    harness: Harness,
) -> None:
    # Given w1 registered once over the worker API with zone=a
    first = _register(harness, "w1", {"zone": "a"})
    bound = _approval(harness, "w1")
    assert bound.labels == {"zone": "a"} and bound.approved_by is None and bound.requested_labels is None

    # When a new session asks for zone=b (or zone=a plus more), it is refused and registers nothing
    for labels in ({"zone": "b"}, {"zone": "a", "gpu": "yes"}, {}):
        with pytest.raises(worker_labels.LabelsNotApproved) as caught:
            _register(harness, "w1", labels)
        assert caught.value.code == "labels_not_approved" and caught.value.http_status == 403
    worker = harness.db.transaction(lambda tx: tx.one("worker_get", {"worker_id": "w1"}), write=False)
    assert worker is not None and worker["session_id"] == first.session_id and worker["generation"] == 1

    # And the same labels register again (a restarted worker: a new session, generation 2)
    again = _register(harness, "w1", {"zone": "a"})
    assert again.generation == 2
    # And the embedded worker's in-process registration is not bound (its labels are the server's flags)
    assert _register(harness, "w1", {"zone": "z"}, bound=False).generation == 3


def test_a_refused_request_is_kept_for_an_admin_who_approves_it(harness: Harness) -> None:
    _register(harness, "w1", {"zone": "a"})
    with pytest.raises(worker_labels.LabelsNotApproved):
        _register(harness, "w1", {"zone": "b"})
    harness.db.transaction(lambda tx: worker_labels.record_request(tx, "w1", {"zone": "b"}))
    pending = _approval(harness, "w1")
    assert pending.requested_labels == {"zone": "b"} and pending.requested_at_ms is not None
    assert pending.labels == {"zone": "a"}

    # When an admin approves them, the request is gone and zone=b registers, zone=a no longer does
    approved = harness.db.transaction(
        lambda tx: worker_labels.approve(tx, "w1", {"zone": "b"}, approved_by=ADMIN)
    )
    assert approved.labels == {"zone": "b"} and approved.approved_by == ADMIN
    assert approved.requested_labels is None and approved.requested_at_ms is None
    assert _register(harness, "w1", {"zone": "b"}).generation == 2
    with pytest.raises(worker_labels.LabelsNotApproved):
        _register(harness, "w1", {"zone": "a"})


def test_a_credential_minted_with_labels_approves_exactly_those(harness: Harness) -> None:
    # Given w1 bound to zone=a by its first registration
    _register(harness, "w1", {"zone": "a"})
    first = harness.db.transaction(lambda tx: worker_credentials.issue(tx, "w1"))
    harness.db.transaction(lambda tx: worker_credentials.revoke(tx, first.record.id))

    # When an admin mints its next credential for zone=b
    harness.db.transaction(
        lambda tx: worker_credentials.issue(tx, "w1", labels={"zone": "b"}, issued_by=ADMIN)
    )

    # Then zone=b registers and zone=a is refused; a credential minted without labels changes nothing
    assert _approval(harness, "w1").labels == {"zone": "b"}
    _register(harness, "w1", {"zone": "b"})
    with pytest.raises(worker_labels.LabelsNotApproved):
        _register(harness, "w1", {"zone": "a"})
    harness.db.transaction(lambda tx: worker_credentials.issue(tx, "w2", labels={}, issued_by=ADMIN))
    with pytest.raises(worker_labels.LabelsNotApproved):
        _register(harness, "w2", {"zone": "a"})  # minted for no labels: none is approved


def test_a_worker_registered_before_labels_were_bound_keeps_the_ones_it_runs_with(harness: Harness) -> None:
    # Given w1 registered in a version without binding (no approval row)
    _register(harness, "w1", {"zone": "a"}, bound=False)

    # Then its first bound registration may not widen them: its running labels are what is bound
    with pytest.raises(worker_labels.LabelsNotApproved):
        _register(harness, "w1", {"zone": "b"})
    # (the refusal wrote nothing; the worker API then records the request, binding what runs)
    assert harness.db.transaction(lambda tx: tx.one("worker_labels_get", {"worker_id": "w1"})) is None
    harness.db.transaction(lambda tx: worker_labels.record_request(tx, "w1", {"zone": "b"}))
    kept = _approval(harness, "w1")
    assert kept.labels == {"zone": "a"} and kept.requested_labels == {"zone": "b"}
    assert _register(harness, "w1", {"zone": "a"}).generation == 2


def test_bad_labels_or_worker_ids_are_refused_and_write_nothing(harness: Harness) -> None:
    before = count(harness.db, "worker_label_approvals")
    for worker_id, labels in (
        ("w1", {"k": "\x00"}),
        ("bad id!", {"k": "v"}),
        ("w1", {str(i): "v" for i in range(40)}),
    ):
        with pytest.raises(ValidationFailed):
            harness.db.transaction(
                lambda tx, w=worker_id, ls=labels: worker_labels.approve(tx, w, ls, approved_by=ADMIN)
            )
    with pytest.raises(NotFound):
        _approval(harness, "w-unknown")
    assert count(harness.db, "worker_label_approvals") == before
