"""What one worker host is configured with: identity, slots, leases, journal and log budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ql3.domain import leases as lease_rules
from ql3.domain.errors import ValidationFailed
from ql3.domain.workers import validate_worker_id

MAX_SLOTS: Final = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    worker_id: str
    home: Path
    slots: int = 4
    labels: dict[str, str] = field(default_factory=dict)
    session_lease_ms: int = 30_000
    run_lease_ms: int = 30_000
    log_cap_bytes: int = 16 * 1024 * 1024
    journal_capacity: int = 64
    intake_threads: int = 2
    journal_retention_ms: int = 3_600_000
    # Where a task without its own cwd runs (``ql3 serve``: $QL3_HOME/scripts); None: the worker's cwd.
    default_cwd: str | None = None

    def __post_init__(self) -> None:
        validate_worker_id(self.worker_id)
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ValidationFailed("slots must be 1-1024", field="slots")
        if not 1 <= self.journal_capacity <= 1024 or self.journal_capacity < self.slots:
            raise ValidationFailed("journal capacity must cover the slots and be at most 1024")
        if not 60_000 <= self.journal_retention_ms <= 30 * 24 * 3_600_000:
            raise ValidationFailed("journal retention must be 1 min - 30 days", field="journal_retention_ms")
        if not 1 <= self.intake_threads <= 16:
            raise ValidationFailed("intake_threads must be 1-16", field="intake_threads")
        if not lease_rules.RUN.contains(self.run_lease_ms) or not lease_rules.SESSION.contains(
            self.session_lease_ms
        ):
            raise ValidationFailed("lease durations must be 5 s - 10 min")

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def receipts_dir(self) -> Path:
        return self.home / "receipts"

    @property
    def capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = {"executors": ["local_process"], "operatingSystem": "linux"}
        if self.labels:
            caps["labels"] = dict(self.labels)
        return caps
