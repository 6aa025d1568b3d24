"""What the parts of one worker agent share, built once by ``agent.py`` (its composition root).

Intake, maintenance and reconciliation each take this context plus what is only theirs (the
launcher and exit watcher, the running ACK), instead of each repeating the same constructor
parameters and fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ql3.domain.journal import JournalRecord
from ql3.ports.control_plane import ControlPlane
from ql3.ports.execution import HostDeadlines, Journal
from ql3.worker.attempts import ActiveAttempts
from ql3.worker.config import WorkerConfig
from ql3.worker.session import WorkerSession
from ql3.worker.settlement import Settlement
from ql3.worker.stops import LocalStops

# The intake's running ACK, which maintenance (a retry) and reconciliation (after a restart) also send.
AckRunning = Callable[[JournalRecord], JournalRecord]


@dataclass(frozen=True, slots=True)
class WorkerContext:
    client: ControlPlane
    config: WorkerConfig
    clock: Callable[[], int]  # the worker's clock (ms)
    session: WorkerSession
    attempts: ActiveAttempts  # the in-memory active set
    journal: Callable[[], Journal]  # the open journal (it is opened at start, after construction)
    settlement: Settlement
    stops: LocalStops
    # The host executor's board and the host clock it keeps time by (docs/reliability.md "Time");
    # None where no executor runs (tests that drive the agent in-process).
    deadlines: HostDeadlines | None = None
    host_clock: Callable[[], int] = lambda: 0
    # Whether the executor stops an attempt at its local fence deadline. False only where no other
    # process can re-grant a run while this one is away: ``ql3 serve`` on SQLite, whose control plane
    # is this very process (docs/reliability.md "Time").
    local_fence: bool = True
