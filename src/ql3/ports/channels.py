"""The wake-up channels of the storage port (``Transaction.notify`` / ``Database.wait_for``): the only
names a commit may notify or a loop may wait on (docs/architecture.md, "Wake-ups").

A notification is a hint, never a message: a loop woken on its channel re-reads the database, and
without one it still runs on its backstop. ``tests/unit/test_query_catalogue.py`` checks that every
channel here has a listener and a notifier in the code, and that no code names a channel by a string.
"""

from __future__ import annotations

from typing import Final

# A run became dispatchable (created, retried, released to the queue), or the embedded worker of
# ``ql3 serve`` freed a slot its dispatcher was waiting for: the dispatcher and the pull long-polls.
RUNS: Final = "runs"
# A lease ended and freed its worker's slot (``leases.end_attempt``): the pull long-polls, and the
# dispatcher of ``ql3 serve`` only while queued runs wait for a slot (after a scan that found the queue
# empty, a freed slot has nothing to place: one wake-up per run, not three; bench/README.md).
SLOTS: Final = "slots"
# A task's schedule changed: the cron loop re-plans its next occurrence.
SCHEDULES: Final = "schedules"
# A cancel intent was recorded: the cancellation supervisor and the cluster's stop long-polls.
CANCELLATIONS: Final = "cancellations"
# An attempt started (a new deadline to watch): the cancellation loop re-plans its timeouts.
ATTEMPTS: Final = "attempts"
# An approval was decided or consumed: the approved-action loop.
APPROVED_ACTIONS: Final = "approved_actions"
# A lost attempt's run is due a retry: the lease-expiry loop admits it.
RETRIES: Final = "retries"
# A notification was queued in the outbox: the delivery loop.
NOTIFICATIONS: Final = "notifications"
# A retention policy changed: the pruning loop.
RETENTION: Final = "retention"
# A subscription was added or removed: the subscription loop re-plans its next scheduled sync.
SUBSCRIPTIONS: Final = "subscriptions"
# The embedded worker's maintenance loop. No commit notifies it (the worker's timers run on its
# backstop); the loop's own stop interrupts its wait.
MAINTAIN: Final = "maintain"

ALL: Final = (
    RUNS,
    SLOTS,
    SCHEDULES,
    CANCELLATIONS,
    ATTEMPTS,
    APPROVED_ACTIONS,
    RETRIES,
    NOTIFICATIONS,
    RETENTION,
    SUBSCRIPTIONS,
    MAINTAIN,
)
# What a replica relays from other replicas' commits (PostgreSQL LISTEN/NOTIFY, channel ``ql3_<name>``).
RELAYED: Final = (RUNS, SLOTS, SCHEDULES, CANCELLATIONS, ATTEMPTS, APPROVED_ACTIONS, RETRIES)
