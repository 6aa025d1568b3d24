"""The worker's execution ports: what the worker agent asks of the launcher, the exit watcher, the
process controller and its journal. The adapters are ``execution/launcher.py`` (``LocalLauncher``,
``ExitWatcher``), ``execution/controller.py`` (``ProcessController``) and ``worker/journal/``
(``WorkerJournal``); the worker's parts depend on these Protocols only, and ``worker/agent.py`` picks
the adapters. Each method's docstring is its contract.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from ql3.domain.errors import Ql3Error
from ql3.domain.execution import ScriptPayload
from ql3.domain.journal import AcceptResult, JournalOffer, JournalRecord, JournalState, RecoveryReason


class LaunchRejected(Ql3Error, ValueError):
    """The launch request is invalid; nothing was started."""

    code = "launch_rejected"
    http_status = 422

    def __init__(self, reason: str) -> None:
        super().__init__(None, reason=reason)
        self.reason = reason


class LaunchFailed(Ql3Error):
    """The command could not be started."""

    code = "launch_failed"

    def __init__(self, reason: str) -> None:
        super().__init__(None, reason=reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellCommand:
    """A POSIX shell command line, run as ``/bin/sh -c command``."""

    command: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgvCommand:
    """A program and its arguments, looked up in the child's PATH like ``execvp``."""

    file: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    run_id: str
    attempt_id: str
    command: ShellCommand | ArgvCommand = field(repr=False)
    working_directory: str | None = field(repr=False)
    environment_policy: Literal["inherit", "isolated"]
    environment: Mapping[str, str] = field(repr=False)
    callback_token: str = field(repr=False)
    callback_sequence: int
    log_path: Path
    receipt_dir: Path
    log_cap_bytes: int
    started_at_ms: int
    project_id: str | None = None  # picks the project's task user (TaskUsers)
    # The project script the command runs (docs/scripts.md): written to a file named by its digest,
    # whose path the command gets as ``$QL3_SCRIPT``.
    script: ScriptPayload | None = field(default=None, repr=False)


class ProcessIdentity(Protocol):
    """The durable identity of a started shim (``execution/identity.py:ProcessHandle``)."""

    def encode(self) -> str:
        """The handle's text form: what the journal and the control plane store."""
        ...


class LaunchedProcess(Protocol):
    """A started attempt, as the launcher returns it."""

    @property
    def pid(self) -> int: ...

    @property
    def handle(self) -> ProcessIdentity: ...


LaunchedT_co = TypeVar("LaunchedT_co", bound=LaunchedProcess, covariant=True)
LaunchedT_contra = TypeVar("LaunchedT_contra", bound=LaunchedProcess, contravariant=True)


class Launcher(Protocol[LaunchedT_co]):
    def start(self, request: LaunchRequest) -> LaunchedT_co:
        """Start ``request``'s command under the shim, as the leader of a new process group.

        Raises ``LaunchRejected`` for an invalid request and ``LaunchFailed`` when it could not be
        started: nothing runs then. Otherwise the caller owns the result and must pass it to the exit
        watcher (which reaps the shim)."""
        ...


class ExitWatch(Protocol[LaunchedT_contra]):
    """Reaps started shims and calls back with the attempt id when one has exited."""

    def start(self) -> None:
        """Start the watcher thread; idempotent."""
        ...

    def stop(self, timeout_s: float = ...) -> None:
        """Stop the watcher thread (the shims keep running and are re-adopted after a restart)."""
        ...

    def watch(self, launched: LaunchedT_contra) -> None:
        """Take ownership of ``launched``: its exit is reported once, from the watcher thread."""
        ...


class StopResult(Protocol):
    @property
    def status(self) -> str:
        """``termination_requested`` or ``already_exited`` when the group is stopped (or proven gone);
        ``identity_mismatch``, ``pid_mismatch``, ``unsupported`` or ``invalid`` when no signal was sent."""
        ...


class ProcessController(Protocol):
    def stop(self, handle_text: str, expected_pid: int | None, *, grace_ms: int = ...) -> StopResult:
        """Re-prove the handle's identity, then TERM its process group and KILL it after ``grace_ms``.
        No signal reaches a process whose identity does not match (docs/contracts.md §5)."""
        ...

    def sweep_orphans(self, handle_text: str) -> int:
        """SIGKILL what survived of the group of a shim proven gone, each survivor only on proof that
        it descends from this attempt; returns how many. Raises ``InvalidHandle`` (a ``ValueError``)
        for a handle that does not parse, ``OSError`` when ``/proc`` cannot be read."""
        ...


class Journal(Protocol):
    """The worker's crash barrier (docs/contracts.md §3): one record per offer, each write committed
    before the effect it announces. Raises the ``Journal*`` errors of ``domain/journal.py``."""

    @property
    def capacity(self) -> int: ...

    def close(self) -> None:
        """Release the journal; idempotent. Later calls raise ``JournalClosed``."""
        ...

    def accept(self, offer: JournalOffer) -> AcceptResult:
        """Record a received offer as ``accepted``, deduplicated by offer id; ``JournalConflict`` on any
        identity drift, ``JournalFull`` when ``capacity`` records are active (nothing is evicted)."""
        ...

    def advance(
        self,
        offer_id: str,
        *,
        expected_revision: int,
        to_state: JournalState,
        completion_callback_sequence: int | None = None,
        completion_token_digest: str | None = None,
        log_artifact_id: str | None = None,
        executor_handle: str | None = None,
        executor_started_at_ms: int | None = None,
        recovery_reason: RecoveryReason | None = None,
        via: JournalState | None = None,
        prune: bool = False,
    ) -> JournalRecord:
        """Move one record forward by exactly one transition, CAS on ``expected_revision``; the
        ``launching`` barrier is durable before this returns. ``via``: pass through that field-less
        state first, in the same commit; ``prune``: delete a record reaching a settled state in the
        same commit. ``JournalInvalid`` for bad fields, ``JournalConflict`` (``not_found``,
        ``stale_revision``, ``invalid_transition``) otherwise."""
        ...

    def get(self, offer_id: str) -> JournalRecord | None:
        """The record of ``offer_id``, or None."""
        ...

    def find_by_attempt(self, attempt_id: str) -> JournalRecord | None:
        """The record of ``attempt_id`` with the highest lease generation, or None."""
        ...

    def page(
        self, *, states: Collection[str] | None = None, after_offer_id: str = "", limit: int = ...
    ) -> list[JournalRecord]:
        """Up to ``limit`` (1..64) records after ``after_offer_id`` in offer-id order, optionally by state."""
        ...

    def startup_recovery(self, *, page_size: int = ..., max_pages: int = ...) -> list[JournalRecord]:
        """Turn every ``launching`` record into ``recovery_required: launch_outcome_unknown`` and return
        the records to reconcile; ``JournalBudgetExceeded`` before any write when there are too many."""
        ...

    def retention(self, *, older_than_ms: int, limit: int = ...) -> int:
        """Delete at most ``limit`` settled records older than ``older_than_ms``; returns how many."""
        ...

    def prune(self, offer_id: str) -> bool:
        """Delete one settled record now; in-flight records are never deleted."""
        ...


StopCause = Literal["timeout", "fence"]


class HostDeadlines(Protocol):
    """The host executor's deadline board (execution/deadlines.py, docs/reliability.md "Time"): the
    worker arms each started attempt with its timeout and local fence deadlines on the host clock,
    moves the fence after each renewal, reads why the executor stopped an attempt, and disarms it once
    settled. None of these raise for an I/O failure: the executor keeps what it held last."""

    def start(self) -> None: ...

    def ensure_executor(self) -> bool: ...

    def release(self) -> None: ...

    def arm(
        self,
        attempt_id: str,
        handle: str,
        *,
        timeout_at_ms: int | None,
        fence_at_ms: int | None,
        grace_ms: int,
    ) -> None: ...

    def move_fence(self, attempt_id: str, fence_at_ms: int) -> None: ...

    def armed(self, attempt_id: str) -> bool: ...

    def fired(self, attempt_id: str) -> StopCause | None: ...

    def disarm(self, attempt_id: str) -> None: ...
