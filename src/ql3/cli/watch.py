"""Waiting for a run and tailing its log by polling the API (``--wait``, ``--follow``, ``run logs``).

Every request is bounded by the client's timeout; the poll interval starts at 50 ms and grows to
500 ms while nothing changes, and falls back to 50 ms as soon as new output arrives.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

from ql3.cli import human
from ql3.cli.client import ApiClient, seg
from ql3.cli.errors import CliError
from ql3.domain.states import RUN_TERMINAL

FIRST_POLL_S: Final = 0.05
MAX_POLL_S: Final = 0.5
LOG_PAGE_BYTES: Final = 256 * 1024
MAX_LOG_PAGES: Final = 16_384  # a run's log is capped far below 4 GiB; this only bounds the loop
TRANSIENT: Final = frozenset({"unreachable", "timeout", "storage_busy", "storage_unavailable"})
TRANSIENT_BUDGET_S: Final = 10.0

# The exit status of ``run start --wait`` for each terminal run status.
EXIT_SUCCEEDED: Final = 0
EXIT_FAILED: Final = 2
EXIT_TIMED_OUT: Final = 3
EXIT_CANCELLED: Final = 4
EXIT_WAIT_TIMEOUT: Final = 5
OUTCOME_EXIT: Final[dict[str, int]] = {
    "succeeded": EXIT_SUCCEEDED,
    "failed": EXIT_FAILED,
    "timed_out": EXIT_TIMED_OUT,
    "cancelled": EXIT_CANCELLED,
}
EXIT_CODES_HELP: Final = """\
exit status with --wait or --follow (the run's outcome):
  0    succeeded
  2    failed (the command exited non-zero, could not start, or was lost and not retried)
  3    timed_out
  4    cancelled
  5    --timeout-wait elapsed first (the run goes on)
  1    error, 64 usage (as for every command)
"""


class WaitTimeout(CliError):
    def __init__(self) -> None:
        super().__init__("wait_timeout", "the run did not end within --timeout-wait", EXIT_WAIT_TIMEOUT)


def outcome_exit(run: dict[str, Any]) -> int:
    return OUTCOME_EXIT.get(str(run.get("status")), EXIT_FAILED)


def is_terminal(run: dict[str, Any]) -> bool:
    return run.get("status") in RUN_TERMINAL


class Poller:
    """Backoff between polls, an optional overall deadline and a budget for transient failures."""

    def __init__(
        self,
        *,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._deadline = None if timeout_s is None else clock() + timeout_s
        self._interval = FIRST_POLL_S
        self._failing_since: float | None = None

    def progressed(self) -> None:
        self._interval = FIRST_POLL_S

    def wait(self) -> None:
        """Sleep before the next poll; raise WaitTimeout once the deadline has passed."""
        delay = self._interval
        if self._deadline is not None:
            left = self._deadline - self._clock()
            if left <= 0:
                raise WaitTimeout()
            delay = min(delay, left)
        self._sleep(delay)
        self._interval = min(MAX_POLL_S, self._interval * 2)

    def call(self, api: ApiClient, method: str, path: str, params: dict[str, Any] | None = None) -> Any:
        """One request; transient failures (server restarting, busy) are retried for a bounded time."""
        while True:
            try:
                _, body = api.call(method, path, params=params)
            except CliError as exc:
                if exc.code not in TRANSIENT:
                    raise
                now = self._clock()
                if self._failing_since is None:
                    self._failing_since = now
                if now - self._failing_since > TRANSIENT_BUDGET_S:
                    raise
                self.wait()
                continue
            self._failing_since = None
            return body


def run_path(project: str, run_id: str) -> str:
    return f"/projects/{seg(project)}/runs/{seg(run_id)}"


def wait_for_run(api: ApiClient, project: str, run: dict[str, Any], poller: Poller) -> dict[str, Any]:
    """Poll the run until it is terminal and return it."""
    path = run_path(project, str(run["id"]))
    while not is_terminal(run):
        poller.wait()
        run = poller.call(api, "GET", path)
    return run


# Why a queued run has not started (the run's ``waiting_reason``), in words.
WAITING_REASONS: Final[dict[str, str]] = {
    "no_matching_worker": "no worker has the labels the task requires",
    "no_free_slot": "every slot of the matching workers is busy",
    "worker_draining": "the matching workers are draining",
    "no_worker": "no worker is online",
}
# What the dispatcher said about a run it could not place (the run's ``dispatch_reasons``), in words.
DISPATCH_REASONS: Final[dict[str, str]] = {
    "no_match": "no worker offers the run's executor type and required labels",
    "plans_unavailable": "its task revision cannot be placed (a --require executor= that conflicts?)",
    "claim_raced": "another claim or a stop got to it first",
    "claim_budget_exhausted": "the cycle spent its claims before this run",
    "recovery_plans_unavailable": "its claimed lease cannot be offered again: its pinned revision is gone",
    "no_workers": "no worker was online",
    "no_capacity": "every worker was full",
    "scan_budget_exhausted": "the cycle's scan budget ended before the rest of the queue",
    "recovery_budget_exhausted": "the cycle spent its budget recovering earlier claims",
}
QUIET_QUEUED_S: Final = 3.0  # a server that gives no reason: say "still queued" after this long


def waiting_text(run: dict[str, Any]) -> str | None:
    """``no free slot: every slot ... is busy`` for a queued run whose server says why, else None."""
    reason = run.get("waiting_reason")
    if run.get("status") != "queued" or not isinstance(reason, str) or reason not in WAITING_REASONS:
        return None
    return f"{reason.replace('_', ' ')}: {WAITING_REASONS[reason]}"


def dispatch_reason_lines(run: dict[str, Any], utc: bool) -> list[str]:
    """One line per reason the dispatcher gave about ``run``, most recently seen first: ``no match:
    no worker offers ... (last seen 2026-12-01 09:16:17 CET, 12 times)``; ``cycle`` reasons say so."""
    lines: list[str] = []
    for seen in run.get("dispatch_reasons") or []:
        reason = str(seen.get("reason"))
        text = f"{reason.replace('_', ' ')}: {DISPATCH_REASONS.get(reason, reason)}"
        if seen.get("scope") == "cycle":
            text = f"{text} (every queued run)"
        count = int(seen.get("count") or 0)
        last = human.when(seen.get("last_seen_at_ms"), utc)
        lines.append(f"{text} (last seen {last}, {count} time{'s' if count != 1 else ''})")
    return lines


def wait_while_queued(
    api: ApiClient,
    project: str,
    run: dict[str, Any],
    poller: Poller,
    report: Callable[[str], None] | None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll a queued run until it leaves the queue, telling ``report`` why it waits whenever the
    reason changes (and once, after a few seconds, when the server gives none)."""
    path = run_path(project, str(run["id"]))
    since = clock()
    said: str | None = None
    while run.get("status") == "queued":
        text = waiting_text(run)
        if text is None and said is None and clock() - since >= QUIET_QUEUED_S:
            text = "waiting for a worker to take it"
        if text is not None and text != said:
            said = text
            if report is not None:
                report(f"still queued: {text}")
        poller.wait()
        run = poller.call(api, "GET", path)
    return run


def _write(out: TextIO, text: str) -> None:
    if not text:
        return
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(text.encode("utf-8", errors="replace"))
        buffer.flush()
    else:
        out.write(text)
        out.flush()


def print_log(
    api: ApiClient,
    project: str,
    run_id: str,
    *,
    attempt: int | None = None,
    follow: bool = False,
    poller: Poller | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Print an attempt's log (the latest unless ``attempt``) page by page.

    Without ``follow`` it stops at the current end of the log. With it, it keeps tailing until the run
    is terminal and the log is drained; when the run is retried it finishes the old attempt's log and
    goes on with the new one. Returns the last page's facts (attempt, next_offset, eof, complete).
    """
    sink = out or sys.stdout
    poll = poller or Poller()
    path = f"{run_path(project, run_id)}/logs"
    current = attempt
    offset = 0
    pages = 0
    while True:
        pages += 1
        if not follow and pages > MAX_LOG_PAGES:
            raise CliError("log_too_long", "the log has more pages than this command reads")
        # Following the latest attempt asks for the latest each time, to notice a retry.
        ask = None if follow and attempt is None else current
        page = poll.call(api, "GET", path, _log_params(offset, ask))
        shown = page.get("attempt")
        if current is None:
            current = shown
        elif shown is not None and shown != current:
            _drain(api, path, current, offset, poll, sink)
            current, offset = shown, 0
            poll.progressed()
            continue
        _write(sink, str(page.get("data") or ""))
        moved = int(page["next_offset"]) != offset
        offset = int(page["next_offset"])
        if page.get("complete") or (not follow and page.get("eof")):
            return {k: page.get(k) for k in ("attempt", "next_offset", "eof", "complete")}
        if moved:
            poll.progressed()
        if not page.get("eof"):
            continue
        poll.wait()


def _log_params(offset: int, attempt: int | None) -> dict[str, Any]:
    return {"offset": offset, "max_bytes": LOG_PAGE_BYTES, "attempt": attempt}


def _drain(api: ApiClient, path: str, attempt: int, offset: int, poll: Poller, sink: TextIO) -> None:
    """The rest of a finished attempt's log, up to its current end."""
    for _ in range(MAX_LOG_PAGES):
        page = poll.call(api, "GET", path, _log_params(offset, attempt))
        _write(sink, str(page.get("data") or ""))
        offset = int(page["next_offset"])
        if page.get("eof"):
            return
