"""A worker credential is bound to its worker's labels (docs/security.md "A remote worker").

Placement matches runs to workers by label, so the labels a session registers with decide which
projects' runs (commands, environment values, lease tokens) it may pull. Whoever holds a worker
credential must not be able to widen them: a session registered over the worker API must carry
exactly the labels approved for its worker id. The first registration of a worker id binds its
labels; from then on other labels are refused (403 ``labels_not_approved``, nothing registered)
until an admin approves them (``ql3 worker approve``) or mints a credential for them
(``ql3 worker token create --label``). The embedded worker of ``ql3 serve`` registers in process
with the server's own flags and is not bound.
"""

from __future__ import annotations

from collections.abc import Mapping

from ql3.domain.errors import NotFound, PermissionDenied
from ql3.domain.workers import parse_capabilities, validate_worker_id
from ql3.ports.storage import Transaction
from ql3.repositories import worker_labels as store
from ql3.repositories import workers as worker_store
from ql3.repositories.worker_labels import LabelApproval as LabelApproval


class LabelsNotApproved(PermissionDenied):
    """These labels are not approved for this worker (an admin runs ql3 worker approve)."""

    code = "labels_not_approved"


def checked_labels(labels: object) -> dict[str, str]:
    """Labels as the worker registry accepts them (ValidationFailed otherwise)."""
    caps = parse_capabilities({"executors": ["local_process"], "labels": labels})
    return caps.label_map


def require_approved(tx: Transaction, worker_id: str, labels: Mapping[str, str]) -> None:
    """Refuse a registration whose labels are not the worker id's approved ones. A worker id without
    approved labels gets these (or, registered before labels were bound, the ones it runs with)."""
    if _bound(tx, worker_id, labels).labels != dict(labels):
        raise LabelsNotApproved(worker_id=worker_id)


def _bound(tx: Transaction, worker_id: str, labels: Mapping[str, str]) -> LabelApproval:
    approval = store.get(tx, worker_id)
    if approval is None:
        registered = worker_store.get_worker(tx, worker_id)
        first = dict(labels) if registered is None else _registered_labels(registered.capabilities)
        store.bind_first(tx, worker_id, first)
        approval = store.get(tx, worker_id)
        assert approval is not None
    return approval


def _registered_labels(capabilities: Mapping[str, object]) -> dict[str, str]:
    raw = capabilities.get("labels", {})
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def record_request(tx: Transaction, worker_id: str, labels: Mapping[str, str]) -> None:
    """Keep the labels of a refused registration as the pending request an admin may approve (the
    refusal rolled its transaction back: a worker registered before labels were bound is bound here)."""
    if _bound(tx, worker_id, labels).labels != dict(labels):
        store.request(tx, worker_id, labels)


def approve(tx: Transaction, worker_id: str, labels: Mapping[str, str], *, approved_by: str) -> LabelApproval:
    """Set the labels ``worker_id`` may register with (and drop its pending request)."""
    validate_worker_id(worker_id)
    store.approve(tx, worker_id, checked_labels(dict(labels)), approved_by=approved_by)
    approval = store.get(tx, worker_id)
    assert approval is not None
    return approval


def get(tx: Transaction, worker_id: str) -> LabelApproval:
    validate_worker_id(worker_id)
    approval = store.get(tx, worker_id)
    if approval is None:
        raise NotFound("no labels are bound to this worker yet")
    return approval
