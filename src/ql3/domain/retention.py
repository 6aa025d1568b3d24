"""A project's retention policy (docs/retention.md): which finished runs and how much of their logs
are kept. A limit that is None is off; a policy with every limit off keeps everything."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    project_id: str
    keep_days: int | None
    runs_per_task: int | None
    log_bytes_per_run: int | None
    version: int
    updated_at_ms: int
