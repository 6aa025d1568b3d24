"""Retention: per-project policies and the bounded pruner of runs, their rows and their log files.

Each step deletes at most one page of terminal runs (with their attempts, events, leases, retry and
cancellation rows, and the shipped log chunks of their attempts first, in bounded batches) in one short
write transaction, so a prune never holds the write lock for long and
other writers interleave between pages. Log files of a page are removed before its rows: a crash in
between leaves rows whose logs are gone (the next step deletes them), never orphaned files.
See docs/retention.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Final

from ql3.application.parking import ItemGuard, guarded
from ql3.domain.errors import ValidationFailed
from ql3.domain.model import Project
from ql3.domain.retention import RetentionPolicy as RetentionPolicy
from ql3.ports.logs import LogFiles
from ql3.ports.storage import Database, Transaction
from ql3.repositories import retention as repo

DAY_MS: Final = 86_400_000
MAX_KEEP_DAYS: Final = 36_500
MAX_RUNS_PER_TASK: Final = 100_000_000
MIN_LOG_BYTES: Final = 1024
MAX_LOG_BYTES: Final = 1 << 40
OUTBOX_KEEP_MS: Final = 7 * DAY_MS
DEFAULT_PAGE: Final = 200
CHUNK_BATCH: Final = 1000  # shipped log chunks deleted per transaction (64 MiB at most)
MAX_CHUNK_BATCHES: Final = 1000  # per page of runs; a page left with chunks fails and is retried
TASK_PAGE: Final = 64  # tasks read per page when looking for runs beyond runs_per_task


def _bounded(value: object, low: int, high: int, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise ValidationFailed(f"{field} must be between {low} and {high}", field=field)
    return value


def set_policy(
    tx: Transaction,
    project: Project,
    *,
    keep_days: int | None,
    runs_per_task: int | None,
    log_bytes_per_run: int | None,
) -> RetentionPolicy:
    """Replace the project's policy; None switches a limit off (all None keeps everything)."""
    repo.upsert_policy(
        tx,
        project_id=project.id,
        keep_days=_bounded(keep_days, 1, MAX_KEEP_DAYS, "keep_days"),
        runs_per_task=_bounded(runs_per_task, 1, MAX_RUNS_PER_TASK, "runs_per_task"),
        log_bytes_per_run=_bounded(log_bytes_per_run, MIN_LOG_BYTES, MAX_LOG_BYTES, "log_bytes_per_run"),
        now=tx.now_ms(),
    )
    found = get_policy(tx, project)
    assert found is not None
    return found


def get_policy(tx: Transaction, project: Project) -> RetentionPolicy | None:
    return repo.get_policy(tx, project.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneReport:
    runs_deleted: int = 0
    log_bytes_freed: int = 0
    logs_capped: int = 0
    outbox_deleted: int = 0
    more: bool = False


class RetentionPruner:
    """Applies every project's policy in bounded steps. ``prune_once`` is one loop cycle."""

    def __init__(
        self,
        db: Database,
        logs: LogFiles | None,
        *,
        page: int = DEFAULT_PAGE,
        max_pages: int = 8,
        max_projects: int = 64,
        max_tasks: int = 256,
        guard: ItemGuard | None = None,
    ) -> None:
        if not (1 <= page <= 1000 and 1 <= max_pages <= 1000 and 1 <= max_projects <= 1000):
            raise ValidationFailed("invalid retention budget")
        self._db = db
        self._logs = logs
        self._page = page
        self._max_pages = max_pages
        self._max_projects = max_projects
        self._max_tasks = max_tasks
        self._guard = guard

    # -- one page of runs ---------------------------------------------------------------------------

    def delete_runs(self, run_ids: list[str]) -> tuple[int, int]:
        """Remove the runs' log files, then their rows in one transaction; (runs deleted, bytes freed)."""
        if not run_ids:
            return 0, 0
        freed = 0
        if self._logs is not None:
            attempts = self._db.transaction(partial(repo.list_attempt_ids, run_ids=run_ids), write=False)
            for attempt_id in attempts:
                freed += self._logs.remove(attempt_id)

        attempt_ids = self._db.transaction(partial(repo.list_attempt_ids, run_ids=run_ids), write=False)
        for _ in range(MAX_CHUNK_BATCHES):
            # Shipped log chunks (docs/cluster.md) in bounded batches before the rows that own them.
            deleted = self._db.transaction(
                lambda tx: repo.delete_log_chunks(tx, attempt_ids, limit=CHUNK_BATCH)
            )
            if deleted < CHUNK_BATCH:
                break

        def unit(tx: Transaction) -> int:
            attempts = repo.list_attempt_ids(tx, run_ids)
            # A chunk shipped after the batches above (a worker's last flush) goes with its head.
            repo.delete_log_chunks(tx, attempts, limit=CHUNK_BATCH)
            return repo.delete_runs(tx, run_ids, attempts)

        return self._db.transaction(unit), freed

    def _next_page(self, policy: RetentionPolicy) -> list[str]:
        """The next page of runs this policy lets go (oldest first), or [] when within the policy."""

        def unit(tx: Transaction) -> list[str]:
            if policy.keep_days is not None:
                before = tx.now_ms() - policy.keep_days * DAY_MS
                found = repo.list_old_run_ids(
                    tx, project_id=policy.project_id, before_ms=before, limit=self._page
                )
                if found:
                    return found
            if policy.runs_per_task is None:
                return []
            after = ""
            scanned = 0
            while scanned < self._max_tasks:
                tasks = repo.list_task_ids(tx, project_id=policy.project_id, after=after, limit=TASK_PAGE)
                for task_id in tasks:
                    boundary = repo.get_task_boundary(tx, task_id=task_id, keep=policy.runs_per_task)
                    if boundary is not None:
                        found = repo.list_task_run_ids_up_to(
                            tx, task_id=task_id, boundary=boundary, limit=self._page
                        )
                        if found:
                            return found
                scanned += len(tasks)
                if len(tasks) < TASK_PAGE:
                    break
                after = tasks[-1]
            return []

        return self._db.transaction(unit, write=False)

    def _cap_logs(self, policy: RetentionPolicy, cursor: tuple[int, str]) -> tuple[int, int, bool]:
        """Cap the logs of one page of attempts finished after the cursor; (capped, freed, more)."""
        assert policy.log_bytes_per_run is not None and self._logs is not None
        finished = self._db.transaction(
            lambda tx: repo.list_finished_attempts(
                tx, project_id=policy.project_id, after_ms=cursor[0], after_id=cursor[1], limit=self._page
            ),
            write=False,
        )
        capped = freed = 0
        for attempt in finished:
            cut = self._logs.cap(attempt.id, policy.log_bytes_per_run)
            capped += 1 if cut else 0
            freed += cut
        if finished:
            last = finished[-1]
            self._db.transaction(
                lambda tx: repo.update_log_cursor(
                    tx, project_id=policy.project_id, cursor_ms=last.finished_at_ms, cursor_id=last.id
                )
            )
        return capped, freed, len(finished) == self._page

    def _prune_outbox(self, tx: Transaction) -> int:
        """One page of delivered and dead notifications older than a week, in every project."""
        return repo.delete_outbox_page(tx, before_ms=tx.now_ms() - OUTBOX_KEEP_MS, limit=self._page)

    # -- the cycle ------------------------------------------------------------------------------------

    def prune_once(self) -> PruneReport:
        """Up to ``max_pages`` pages of work across all policies; ``more`` when work was left over."""
        policies = self._db.transaction(
            lambda tx: [
                (p.policy, (p.log_cursor_ms, p.log_cursor_id))
                for p in repo.list_policies(tx, after="", limit=self._max_projects)
            ],
            write=False,
        )
        pages = runs = freed = capped = outbox = 0
        more = False

        def one_project(policy: RetentionPolicy, cursor: tuple[int, str]) -> bool:
            """One project's pages; False when the cycle's page budget ran out."""
            nonlocal pages, runs, freed, capped, more
            while pages < self._max_pages:
                page = self._next_page(policy)
                if not page:
                    break
                deleted, bytes_freed = self.delete_runs(page)
                pages += 1
                runs += deleted
                freed += bytes_freed
            else:
                more = True
            if pages >= self._max_pages:
                more = True
                return False
            if policy.keep_days is not None:
                # Skipped cron occurrences (docs/cron.md) are kept as long as the project's runs.
                before = self._db.transaction(lambda tx: tx.now_ms(), write=False) - policy.keep_days * DAY_MS
                skips = self._db.transaction(
                    lambda tx: repo.delete_cron_skips_page(
                        tx, project_id=policy.project_id, before_ms=before, limit=self._page
                    )
                )
                more = more or skips >= self._page
            if policy.log_bytes_per_run is not None and self._logs is not None:
                n, cut, left = self._cap_logs(policy, cursor)
                pages += 1
                capped += n
                freed += cut
                more = more or left
            return True

        for policy, cursor in policies:
            # A project whose pruning fails for a reason other than an outage is parked; the other
            # projects are pruned in this same cycle.
            went_on = guarded(self._guard, "project", policy.project_id, partial(one_project, policy, cursor))
            if went_on is False or pages >= self._max_pages:
                more = more or pages >= self._max_pages
                break
        if pages < self._max_pages:
            outbox = self._db.transaction(self._prune_outbox)
            more = more or outbox >= self._page
        return PruneReport(
            runs_deleted=runs, log_bytes_freed=freed, logs_capped=capped, outbox_deleted=outbox, more=more
        )
