"""The remote worker process (``ql3 worker --server URL``): the embedded worker's agent, journal,
launcher and process controller, driven through ``HttpControlPlane`` (docs/cluster.md "Worker").

Four threads besides the agent's own: the pull long-poll, the stop long-poll (lease control),
maintenance (renewals, heartbeats, adopted processes) and the log shipper (each attempt's log to the
server, cluster/log_shipper.py). Losing the server is survived: calls retry
with backoff, the agent's fences refuse what its lost session held, and a fenced session is replaced
by a fresh registration. SIGTERM drains: no new pulls, the runs in progress finish, then offline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ql3.application.lifecycle import LifecycleRunner
from ql3.cluster.http_control_plane import HttpControlPlane
from ql3.cluster.log_shipper import LogShipper
from ql3.cluster.pull import MAX_PULL_PAIRS, pull_offer_id
from ql3.domain.digests import new_token
from ql3.domain.errors import Conflict, FenceConflict, Ql3Error
from ql3.domain.offers import Offer
from ql3.execution.deadlines import DeadlineBoard
from ql3.execution.launcher import LocalLauncher
from ql3.ports.control_plane import ControlPlaneUnreachable
from ql3.worker.agent import WorkerAgent
from ql3.worker.attempts import journal_offer
from ql3.worker.config import WorkerConfig

log = logging.getLogger("ql3.worker.remote")
PULL_WAIT_MS: Final = 20_000
STOP_WAIT_MS: Final = 20_000
BACKOFF_FIRST_S: Final = 0.2
BACKOFF_MAX_S: Final = 10.0
PENDING_STOP_RETRY_S: Final = 1.0
MAINTAIN_BACKSTOP_S: Final = 2.0
LOG_FLUSH_S: Final = 5.0  # a draining worker's last logs, at most this long before it goes offline


@dataclass(slots=True)
class _Pairs:
    """The (offer id, lease token) pairs of one pull, one per free slot when it was proposed."""

    pairs: list[tuple[str, str]]
    failed_at: float | None = None
    sent: bool = False  # sent in a pull before (or saved by an earlier run of the worker)


class RemoteWorker:
    def __init__(
        self,
        plane: HttpControlPlane,
        config: WorkerConfig,
        *,
        clock: Callable[[], int] | None = None,
        fault: Callable[[str], None] | None = None,
        launcher: LocalLauncher | None = None,
        notify_url: str | None = None,
    ) -> None:
        self.plane = plane
        self.config = config
        self.agent = WorkerAgent(
            plane,
            config,
            clock=clock or (lambda: time.time_ns() // 1_000_000),
            fault=fault,
            # notify_url: where a task's ql3 notify reaches the API (docs/notifications.md).
            launcher=launcher if launcher is not None else LocalLauncher(notify_url=notify_url),
            # The host executor keeps each attempt's deadlines while this process cannot
            # (a network cut, a freeze): docs/reliability.md "Time".
            deadlines=DeadlineBoard(config.home / "executor"),
        )
        self._stopping = threading.Event()  # stop now: processes keep running, re-adopted later
        self._draining = threading.Event()
        self._slot_freed = threading.Event()
        # Offers handed to the intake threads and not yet in the agent's active set (nor settled):
        # they hold a lease on the server, so they hold a slot here too (``_busy``).
        self._offered: dict[str, float] = {}
        self._offered_lock = threading.Lock()
        self._agent_lock = threading.RLock()  # re-registration vs. the loops' use of the agent
        # Each attempt's log goes to the database through the server (docs/cluster.md "Log shipping").
        self.logs = LogShipper(plane, config.logs_dir, lambda: self.agent.session)
        plane.final_logs = self.logs  # a completion carries its log's last chunk (one request fewer)
        self.agent.on_settled = self._settled
        self._threads: list[threading.Thread] = []
        self._maintain: LifecycleRunner | None = None

    def _settled(self, attempt_id: str) -> None:
        with self._offered_lock:
            self._offered.pop(attempt_id, None)
        self._slot_freed.set()
        self.logs.settled(attempt_id)  # the final flush; never blocks the agent

    def _submit(self, offer: Offer, *, asked_at: float | None = None) -> None:
        self.logs.track(offer.fence.attempt_id)
        with self._offered_lock:
            self._offered[offer.fence.attempt_id] = time.monotonic()
        self.agent.submit(offer, asked_at=asked_at)

    def _busy(self) -> int:
        """Slots taken: the active attempts and the offers still on their way into the active set
        (without them a pull right after an offer would ask for a slot the server still counts as
        held, and be answered ``no_capacity`` after a transaction). An offer whose intake failed
        stops counting once its lease would have run out."""
        now = time.monotonic()
        horizon_s = self.config.run_lease_ms / 1000
        with self._offered_lock:
            for attempt_id, at in list(self._offered.items()):
                if now - at > horizon_s or self.agent.is_active(attempt_id):
                    del self._offered[attempt_id]
            waiting = len(self._offered)
        return self.agent.active_count + waiting

    def _track_in_flight(self) -> None:
        """After a restart: the attempts the journal still runs (re-adopted processes) are tailed
        again; the server's answers resume each from what it already stored."""
        after = ""
        for _ in range(self.config.journal_capacity // 64 + 1):
            try:
                records = self.agent.journal.page(
                    states={"launching", "started", "running_acknowledged"}, after_offer_id=after, limit=64
                )
            except Ql3Error:
                return
            for record in records:
                self.logs.track(record.attempt_id)
            if len(records) < 64:
                return
            after = records[-1].offer_id

    # -- start / stop -------------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt) * (0.5 + random.random()))

    def start(self) -> bool:
        """Register (retrying while the server is away); False when stopped first."""
        attempt = 0
        while not self._stopping.is_set():
            try:
                with self._agent_lock:
                    self.agent.start()
                break
            except (ControlPlaneUnreachable, OSError) as exc:
                self.agent.stop()
                log.warning(
                    "server unreachable",
                    extra={"action": "worker.register_retry", "error": type(exc).__name__},
                )
                self._stopping.wait(self._backoff(attempt))
                attempt += 1
        if self._stopping.is_set():
            return False
        self._track_in_flight()
        self.logs.start()
        self._resume_unstarted()
        self._maintain = LifecycleRunner(
            "worker-maintain",
            self._maintain_cycle,
            wake=self._maintain_wait,
            backstop_s=MAINTAIN_BACKSTOP_S,
            interrupt=self._slot_freed.set,
        )
        self._maintain.start()
        for name, target in (("ql3-pull", self._pull_loop), ("ql3-stops", self._stop_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    def _resume_unstarted(self) -> None:
        """Offers journaled but never spawned (the worker was killed before its spawn) cannot be
        resumed from the journal alone, which never holds a command. A replay-only pull of the
        journaled pair re-delivers each one, with its spec, while its lease lives; receive then
        resumes from the journaled state (nothing was spawned, so spawning now is safe). A pair whose
        lease ended is answered with nothing: that run was released or lost on the server."""
        session = self.agent.session
        if session is None:
            return
        try:
            records = self.agent.journal.page(states={"accepted", "starting_acknowledged"}, limit=64)
        except Ql3Error:
            return
        for record in records:
            try:
                fence = journal_offer(record).fence
            except (ValueError, KeyError, TypeError, Ql3Error):
                continue
            token = record.lease_token  # the journal keeps it sealed and unseals it on read
            if fence.session_id != session.session_id or not token:
                continue
            if pull_offer_id(self.config.worker_id, token) != record.offer_id:
                continue  # not an offer of this worker's pulls
            try:
                offer = self.plane.pull(
                    session, offer_id=record.offer_id, lease_token=token, wait_ms=0, replay_only=True
                )
            except Ql3Error:
                continue  # the lease expires on the server; the run is placed again
            if offer is not None and offer.fence.attempt_id == record.attempt_id:
                log.info("resuming a journaled offer", extra={"action": "worker.resume_offer"})
                self._submit(offer)

    def drain(self) -> None:
        """No new runs; the runs in progress finish (``wait_drained``)."""
        self._draining.set()
        session = self.agent.session
        if session is not None:
            try:
                self.agent.session = self.plane.set_status(session, "draining")
            except Ql3Error as exc:
                log.warning("drain not recorded", extra={"action": "worker.drain_failed", "error": exc.code})

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.agent.active_count > 0 and not self._stopping.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._slot_freed.wait(min(1.0, remaining) if remaining is not None else 1.0)
            self._slot_freed.clear()
        return self.agent.active_count == 0

    def stop(self, *, offline: bool) -> None:
        if offline:
            self.logs.wait_closed(timeout_s=LOG_FLUSH_S)
        session = self.agent.session
        if offline and session is not None and self.agent.active_count == 0:
            try:
                self.plane.set_status(session, "offline")
            except Ql3Error:
                pass
        self._stopping.set()
        self._slot_freed.set()
        if self._maintain is not None:
            self._maintain.stop()
        self.logs.stop()
        self.plane.close()
        for thread in self._threads:
            # A long-poll in flight may hold its thread until the server answers; it is a daemon
            # thread and holds nothing of the journal, so the process does not wait for it.
            thread.join(timeout=0.5)
        with self._agent_lock:
            self.agent.stop()

    # -- maintenance --------------------------------------------------------------------------------

    def _maintain_cycle(self) -> bool:
        with self._agent_lock:
            if self.agent.session is None:
                return False
            return bool(self.agent.maintain())

    def _maintain_wait(self, backstop_s: float) -> bool:
        # Re-adopted processes are not our children: poll them at a short cadence while they exist.
        timeout = min(backstop_s, 0.5) if self.agent.has_adopted() else backstop_s
        return self._stopping.wait(timeout)

    def _reregister(self) -> None:
        """The session was fenced (replaced, offline or expired): everything it held was stopped by
        the agent; a fresh session takes over. Never resumes the fenced one."""
        with self._agent_lock:
            if self.agent.session is not None:
                return
            self.agent.stop()
            try:
                (self.config.home / "session.json").unlink(missing_ok=True)
            except OSError:
                pass
        attempt = 0
        while not self._stopping.is_set():
            try:
                with self._agent_lock:
                    self.agent.start()
                log.warning("re-registered", extra={"action": "worker.reregistered"})
                return
            except (ControlPlaneUnreachable, OSError) as exc:
                with self._agent_lock:
                    self.agent.stop()
                log.warning(
                    "re-register failed",
                    extra={"action": "worker.register_retry", "error": type(exc).__name__},
                )
                self._stopping.wait(self._backoff(attempt))
                attempt += 1
            except Ql3Error as exc:
                # Refused (labels no longer approved, a revoked credential): nothing runs, and the
                # worker asks again slowly, so that an admin's approval brings it back by itself.
                with self._agent_lock:
                    self.agent.stop()
                log.warning(
                    "re-register refused",
                    extra={"action": "worker.register_refused", "error": exc.code},
                )
                self._stopping.wait(BACKOFF_MAX_S)

    # -- the pull long-poll ---------------------------------------------------------------------------

    def _fresh_pairs(self, count: int) -> _Pairs:
        pairs = []
        for _ in range(max(1, min(count, MAX_PULL_PAIRS))):
            token = new_token()
            pairs.append((pull_offer_id(self.config.worker_id, token), token))
        return _Pairs(pairs=pairs)

    def _pair_file(self) -> Path:
        return self.config.home / "pull.json"

    def _save_pairs(self, pulls: _Pairs) -> None:
        """Before a pull is sent: a worker killed while it waits retries the same pairs when it is
        back, so offers claimed for a response it never read are received, not left to expire."""
        path = self._pair_file()
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"pairs": pulls.pairs, "at_ms": time.time_ns() // 10**6}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _saved_pairs(self) -> _Pairs | None:
        try:
            data = json.loads(self._pair_file().read_text())
            age_ms = time.time_ns() // 10**6 - int(data["at_ms"])
            if not 0 <= age_ms < self.config.run_lease_ms // 2:
                return None  # any offer it claimed has expired or is about to: never reuse it
            raw = data["pairs"] if "pairs" in data else [[data["offer_id"], data["token"]]]
            pairs = [(str(o), str(t)) for o, t in raw][:MAX_PULL_PAIRS]
            if not pairs or any(pull_offer_id(self.config.worker_id, t) != o for o, t in pairs):
                return None
            return _Pairs(pairs=pairs, failed_at=time.monotonic(), sent=True)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _clear_pairs(self) -> None:
        with contextlib.suppress(OSError):
            self._pair_file().unlink()

    def _pull_loop(self) -> None:
        pulls: _Pairs | None = self._saved_pairs()
        failures = 0
        reuse_s = self.config.run_lease_ms / 3000
        while not self._stopping.is_set() and not self._draining.is_set():
            session = self.agent.session
            if session is None:
                self._reregister()
                continue
            free = self.config.slots - self._busy()
            if free <= 0:
                self._slot_freed.wait(MAINTAIN_BACKSTOP_S)
                self._slot_freed.clear()
                continue
            if pulls is None or (
                pulls.failed_at is not None and time.monotonic() - pulls.failed_at > reuse_s
            ):
                # Pairs are retried only shortly after a lost response, well within the lease of an
                # offer they may have claimed; after that fresh ones are proposed, one a free slot.
                pulls = self._fresh_pairs(free)
            # A pair never sent before can only be answered with a claim made for this request: its
            # offer is fresh (OfferIntake.receive). A retried or saved pair may replay an older claim.
            asked_at = None if pulls.sent else time.monotonic()
            pulls.sent = True
            try:
                self._save_pairs(pulls)
                offers = self.plane.pull_many(
                    session, pairs=pulls.pairs, wait_ms=PULL_WAIT_MS, fresh=asked_at is not None
                )
            except ControlPlaneUnreachable:
                if pulls.failed_at is None:
                    pulls.failed_at = time.monotonic()
                self._stopping.wait(self._backoff(failures))
                failures += 1
                continue
            except FenceConflict:
                pulls = None
                self._clear_pairs()
                self._fence_lost()
                continue
            except Ql3Error as exc:  # a refused pull (e.g. a revoked credential): back off, keep going
                log.warning("pull refused", extra={"action": "worker.pull_refused", "error": exc.code})
                pulls = None
                self._stopping.wait(self._backoff(failures))
                failures += 1
                continue
            failures = 0
            pulls = None
            self._clear_pairs()
            for offer in offers:
                self._submit(offer, asked_at=asked_at)

    def _fence_lost(self) -> None:
        """The registry no longer holds our session: let maintenance find it (heartbeat) now."""
        with self._agent_lock:
            session = self.agent.session
            if session is None:
                return
            try:
                self.plane.heartbeat(session)
                return
            except FenceConflict:
                pass
            except Ql3Error:
                self._stopping.wait(1.0)
                return
            # Same as a fenced heartbeat in maintain(): stop what it held, then a fresh session.
            self.agent.session_fenced()

    # -- the stop long-poll (lease control) -------------------------------------------------------

    def _stop_loop(self) -> None:
        handled: set[str] = set()
        retry_at: dict[str, float] = {}
        failures = 0
        while not self._stopping.is_set():
            session = self.agent.session
            if session is None:
                self._stopping.wait(0.5)
                continue
            now = time.monotonic()
            for attempt_id, due in list(retry_at.items()):
                if due <= now:
                    del retry_at[attempt_id]
            known = sorted(handled | set(retry_at))
            try:
                found = self.plane.stops(
                    session, wait_ms=STOP_WAIT_MS if not retry_at else 1_000, known=known
                )
            except (ControlPlaneUnreachable, Conflict, Ql3Error):
                self._stopping.wait(self._backoff(failures))
                failures += 1
                continue
            failures = 0
            for attempt_id in found:
                try:
                    with self._agent_lock:
                        decision = self.agent.control_stop(attempt_id)
                except Ql3Error:
                    decision = "pending"
                if decision in ("stop_requested", "terminal", "unknown"):
                    handled.add(attempt_id)
                else:  # pending or not started yet: ask again shortly, without spinning
                    retry_at[attempt_id] = time.monotonic() + PENDING_STOP_RETRY_S
            if len(handled) > 4096:
                handled.clear()
