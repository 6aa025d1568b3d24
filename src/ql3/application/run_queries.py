"""Read models of runs for people: filtered keyset pages and the facts a list shows beside a run.

Filters are validated here, so the HTTP API and the CLI refuse the same bad values with the same
``validation_failed`` (``field`` names the parameter); nothing is silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, get_args

from ql3.application.runs import DEFAULT_PAGE, MAX_PAGE, decode_cursor, encode_cursor
from ql3.domain.errors import ValidationFailed
from ql3.domain.model import Run
from ql3.domain.states import RunStatus
from ql3.ports.storage import Transaction
from ql3.repositories import runs as repo
from ql3.repositories.runs import STATUS_SLOTS
from ql3.repositories.runs import RunRow as RunRow  # the read shape the HTTP DTOs take

RUN_STATUSES: Final[tuple[str, ...]] = get_args(RunStatus)
# The trigger a person means: a re-run of an earlier run (``retry``), one created when an approval was
# granted (``approval``), one a cron schedule admitted (``cron``), or one started by hand (``manual``).
TRIGGERS: Final = ("manual", "cron", "approval", "retry")
MAX_TIME_MS: Final = 2**62

_TRIGGER_OF_TYPE: Final = {"approved_action": "approval", "cron": "cron"}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    statuses: tuple[str, ...] = ()
    task_id: str | None = None
    trigger: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None


def trigger_of(run: Run) -> str:
    """The derived trigger when only the run is at hand (a re-run is known only from the row)."""
    return _TRIGGER_OF_TYPE.get(run.trigger_type, "manual")


def parse_statuses(raw: str | None) -> tuple[str, ...]:
    """``a,b`` into known statuses; an unknown or empty element is refused."""
    if raw is None:
        return ()
    parts = tuple(dict.fromkeys(p.strip() for p in raw.split(",")))
    unknown = [p for p in parts if p not in RUN_STATUSES]
    if unknown or not parts:
        raise ValidationFailed(
            "unknown run status", field="status", allowed=list(RUN_STATUSES), got=unknown[:3]
        )
    return parts


def validate_filter(flt: RunFilter) -> RunFilter:
    if len(flt.statuses) > STATUS_SLOTS or any(s not in RUN_STATUSES for s in flt.statuses):
        raise ValidationFailed("unknown run status", field="status", allowed=list(RUN_STATUSES))
    if flt.trigger is not None and flt.trigger not in TRIGGERS:
        raise ValidationFailed("unknown trigger", field="trigger", allowed=list(TRIGGERS))
    for name, value in (("since", flt.since_ms), ("until", flt.until_ms)):
        if value is not None and not 0 <= value <= MAX_TIME_MS:
            raise ValidationFailed("time out of range", field=name)
    if flt.since_ms is not None and flt.until_ms is not None and flt.since_ms > flt.until_ms:
        raise ValidationFailed("since is after until", field="since")
    return flt


def list_filtered(
    tx: Transaction,
    project_id: str,
    flt: RunFilter,
    *,
    cursor: str | None = None,
    limit: int = DEFAULT_PAGE,
) -> tuple[list[RunRow], str | None]:
    """Newest first, keyset paginated over the filter; reads ``limit + 1`` to know if more follow."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    validate_filter(flt)
    found = repo.filter_runs(
        tx,
        project_id=project_id,
        task_id=flt.task_id,
        statuses=flt.statuses,
        trigger=flt.trigger,
        since_ms=flt.since_ms,
        until_ms=flt.until_ms,
        cursor=decode_cursor(cursor) if cursor else None,
        limit=limit + 1,
    )
    page = found[:limit]
    last = page[-1].run if page else None
    next_cursor = encode_cursor(last.created_at_ms, last.id) if last and len(found) > limit else None
    return page, next_cursor


def describe(tx: Transaction, run: Run) -> RunRow:
    """The list facts (task name, derived trigger, attempt count) for one run."""
    described = repo.describe_run(tx, run)
    # The run was read in this transaction, so its row is there.
    return described if described is not None else RunRow(run=run, task_name=None, trigger=trigger_of(run))
