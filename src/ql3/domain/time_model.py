"""The time model: which clock decides what, and the inequality that keeps one run on one host.

Two clocks decide a run lease (docs/reliability.md, "Time"):

- the control plane's **database clock** decides when a lease expires and when a lost attempt may be
  retried elsewhere (a re-grant);
- each worker host's **host clock** (``CLOCK_BOOTTIME``: monotonic, counts suspended time, shared by
  every process of one boot) decides when the host's executor stops a command whose lease it can no
  longer prove (the *local fence deadline*) or whose timeout has passed.

The host never compares its clock with the database's. It measures only durations: before it asks
the control plane for a lease (a claim, a starting ACK, a renewal) it reads its own clock ``sent``;
the control plane answers with the time the lease has left, ``remaining``, measured by the database
clock at a moment that is *after* ``sent``. So the lease cannot end before ``sent + remaining`` in
real time, and the host's fence deadline is exactly that instant by its own clock, scaled down by the
largest clock-rate error we allow (``MAX_RATE_ERROR_PPM``).

The control plane re-grants a lost attempt no earlier than ``expiry + grace + allowance(grace) +
margin``, where grace is the attempt's own TERM -> KILL grace (which the host times by its own clock,
hence its allowance). The host sends TERM at its fence deadline and KILL ``grace`` later, so the
inequality holds when ``margin`` covers the host's lag from deadline to a dead group
(``MIN_KILL_SLACK_MS``):

    fence_deadline + grace + kill_slack  <=  expiry + grace + allowance(grace) + margin  <=  re-grant

Both sides read the same numbers (the lease duration, the attempt's grace and the margin); the
margin is validated against the lease at start-up (``min_fence_margin_ms``, application/settings.py).
"""

from __future__ import annotations

from typing import Final

MAX_RATE_ERROR_PPM: Final = 10_000
"""The largest relative difference between a host clock's rate and the database clock's we allow (1 %)."""

MIN_KILL_SLACK_MS: Final = 500
"""From a due deadline to a dead group: the executor's wake-up, the KILL and its delivery."""

DEFAULT_FENCE_MARGIN_MS: Final = 2_000
MAX_FENCE_MARGIN_MS: Final = 600_000


def rate_allowance_ms(duration_ms: int) -> int:
    """How much longer than ``duration_ms`` of real time a span the host measures as ``duration_ms``
    may take when its clock runs slow by the allowed rate error: d * r / (1 - r), rounded up."""
    return -(-duration_ms * MAX_RATE_ERROR_PPM // (1_000_000 - MAX_RATE_ERROR_PPM))


def local_fence_deadline(sent_at_ms: int, remaining_ms: int) -> int:
    """The host-clock instant at which the host stops an attempt whose lease it cannot renew.

    ``sent_at_ms``: the host clock read *before* the request that answered ``remaining_ms`` (the
    lease's time left, by the database clock, when the control plane answered). The deadline is never
    later than the lease's end in real time, even when the host clock runs slow by the allowed rate
    error."""
    if remaining_ms <= 0:
        return sent_at_ms
    return sent_at_ms + remaining_ms - rate_allowance_ms(remaining_ms)


def min_fence_margin_ms(run_lease_ms: int) -> int:
    """The smallest margin that keeps the inequality for a lease of ``run_lease_ms``."""
    return MIN_KILL_SLACK_MS + rate_allowance_ms(run_lease_ms)


def regrant_not_before(expires_at_ms: int, grace_ms: int, margin_ms: int) -> int:
    """The earliest database-clock instant at which a lost attempt's run may start elsewhere: its old
    host has stopped it by then (TERM at its fence deadline, KILL after the grace, which the host
    measures by its own clock and so may take up to its rate allowance longer)."""
    return expires_at_ms + grace_ms + rate_allowance_ms(grace_ms) + margin_ms


def timeout_deadline(started_at_ms: int, timeout_ms: int | None) -> int | None:
    """The host-clock instant at which an attempt started at ``started_at_ms`` times out."""
    return None if timeout_ms is None else started_at_ms + timeout_ms
