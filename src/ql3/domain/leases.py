"""The one vocabulary of leases: every leased thing in ql3 and the range its lease may take.

A lease is a time-bounded claim that the database clock ends. Run leases, worker sessions,
cancellation dispatches, approved actions and notification deliveries are all leased; each kind has
its own range because each protects a different span of work (docs/contracts.md, "Leases"). The
ranges live here once, and every validator, default and start-up check reads them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import ValidationFailed


@dataclass(frozen=True, slots=True)
class LeaseBounds:
    """The inclusive range of one kind of lease, in milliseconds."""

    kind: str
    min_ms: int
    max_ms: int

    def __post_init__(self) -> None:
        if not 0 < self.min_ms <= self.max_ms:
            raise ValueError(f"{self.kind}: empty lease range {self.min_ms}-{self.max_ms}")

    def contains(self, lease_ms: object) -> bool:
        return (
            isinstance(lease_ms, int)
            and not isinstance(lease_ms, bool)
            and self.min_ms <= lease_ms <= self.max_ms
        )

    def validate(self, lease_ms: object, *, field: str = "lease_ms") -> int:
        """``lease_ms`` itself when it is an integer in range; ValidationFailed naming the range otherwise."""
        if not self.contains(lease_ms):
            raise ValidationFailed(
                f"{self.kind} lease must be an integer of {self.min_ms}-{self.max_ms} ms", field=field
            )
        assert isinstance(lease_ms, int)
        return lease_ms

    def clamp(self, lease_ms: int) -> int:
        return min(self.max_ms, max(self.min_ms, lease_ms))


RUN: Final = LeaseBounds("run", 5_000, 600_000)
"""A Run lease: the worker renews it while the attempt lives; expiry makes the attempt lost."""

SESSION: Final = LeaseBounds("worker session", 5_000, 600_000)
"""A worker session: heartbeats renew it; expiry takes the worker offline and fences its leases."""

CANCELLATION: Final = LeaseBounds("cancellation", 5_000, 300_000)
"""A cancellation dispatch claimed by a supervisor; it must outlive twice the stop grace."""

APPROVED_ACTION: Final = LeaseBounds("approved action", 1_000, 600_000)
"""An approved action claimed by its executor or its recovery resolver."""

NOTIFICATION: Final = LeaseBounds("notification", 1_000, 600_000)
"""A notification delivery claimed by a sender."""

ALL: Final = (RUN, SESSION, CANCELLATION, APPROVED_ACTION, NOTIFICATION)
