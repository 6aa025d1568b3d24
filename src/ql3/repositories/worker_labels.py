"""The labels each remote worker id may register with (the ``worker_label_approvals`` table):
``application/worker_labels.py`` decides; docs/security.md "A remote worker"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ql3.domain.digests import canonical_json
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import opt_int


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelApproval:
    """``approved_by`` is None when the labels were bound by the worker's first registration."""

    worker_id: str
    labels: dict[str, str]
    approved_by: str | None
    approved_at_ms: int
    requested_labels: dict[str, str] | None
    requested_at_ms: int | None


def _labels(text: object) -> dict[str, str]:
    value = json.loads(str(text))
    return {str(k): str(v) for k, v in value.items()}


def _from_row(row: Row) -> LabelApproval:
    requested = row["requested_labels_json"]
    return LabelApproval(
        worker_id=str(row["worker_id"]),
        labels=_labels(row["labels_json"]),
        approved_by=None if row["approved_by"] is None else str(row["approved_by"]),
        approved_at_ms=int(row["approved_at_ms"]),
        requested_labels=None if requested is None else _labels(requested),
        requested_at_ms=opt_int(row["requested_at_ms"]),
    )


def get(tx: Transaction, worker_id: str) -> LabelApproval | None:
    row = tx.one("worker_labels_get", {"worker_id": worker_id})
    return None if row is None else _from_row(row)


def bind_first(tx: Transaction, worker_id: str, labels: Mapping[str, str]) -> bool:
    """Bind ``labels`` unless the worker id has approved labels already; True when bound now."""
    params = {"worker_id": worker_id, "labels_json": canonical_json(dict(labels)), "now": tx.now_ms()}
    return tx.run("worker_labels_bind", params) == 1


def approve(tx: Transaction, worker_id: str, labels: Mapping[str, str], *, approved_by: str) -> None:
    params = {
        "worker_id": worker_id,
        "labels_json": canonical_json(dict(labels)),
        "approved_by": approved_by,
        "now": tx.now_ms(),
    }
    tx.run("worker_labels_approve", params)


def request(tx: Transaction, worker_id: str, labels: Mapping[str, str]) -> bool:
    """Record ``labels`` as the pending request of a worker id that has a row; True when recorded."""
    params = {"worker_id": worker_id, "labels_json": canonical_json(dict(labels)), "now": tx.now_ms()}
    return tx.run("worker_labels_request", params) == 1
