"""Stop a process group by its durable handle: verify before every TERM and every KILL
(docs/contracts.md §5)."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Literal

from ql3.execution.identity import (
    EXITED_STATES,
    InvalidHandle,
    ProcessHandle,
    ProcStatUnreadable,
    classify,
    read_boot_id,
    read_stat,
)

# linux/pidfd.h (6.9+): signal the process group whose id is the pidfd's own pid.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2
DEFAULT_GRACE_MS = 5_000
MAX_GRACE_MS = 300_000  # the longest grace a task may declare (``--grace``, domain/tasks.py)
DEFAULT_POLL_MS = 50
MAX_POLL_MS = 1_000

StopStatus = Literal[
    "termination_requested", "already_exited", "identity_mismatch", "pid_mismatch", "unsupported", "invalid"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StopOutcome:
    """What ``stop`` did. The flags say which signals were actually delivered to the group."""

    status: StopStatus
    term_signal_sent: bool
    kill_signal_sent: bool


def _outcome(status: StopStatus, term: bool = False, kill: bool = False) -> StopOutcome:
    return StopOutcome(status=status, term_signal_sent=term, kill_signal_sent=kill)


class ProcessController:
    """Signals process groups started by the launcher, and nothing else.

    ``stop`` follows docs/contracts.md §5 step by step:

    1. the handle does not parse -> ``invalid``; not Linux (no pidfds) -> ``unsupported``;
    2. ``expected_pid`` given and different -> ``pid_mismatch``; ``pgid != pid`` -> ``identity_mismatch``;
    3. a pidfd is opened *before* ``/proc/<pid>/stat`` is read, so a matching stat proves the pidfd is
       the handle's process (it held the pid since its start, which precedes the pidfd). Then, with no
       signal sent yet:

       - ``already_exited`` only on proof of exit: another boot id, no such pid, a zombie, or a live
         process that started *later* than the handle says (the pid was reused, ours is gone);
       - ``identity_mismatch`` when the live process at that pid started *earlier* than the handle
         says, or has the same start but another group: impossible for a genuine handle of that
         process, so the handle cannot be trusted, yet nothing proves that its process has exited.

       A malformed boot id or start ticks never gets this far: decoding rejects it (``invalid``). In
       every case except a verified match, zero signals are sent.
    4. SIGTERM goes to the group through the pidfd (``PIDFD_SIGNAL_PROCESS_GROUP``): the kernel
       resolves the group from the pinned pid itself, so PID reuse cannot redirect it, and members left
       behind by an exited leader can still be reached. On kernels without that flag the fallback is
       ``os.killpg`` issued only while the pidfd shows the verified leader still holds its pid (once
       the leader is reaped that proof is gone, and the fallback stops signalling).
       Then every ``poll_ms`` the group is re-verified the same way (plus: any non-zombie member left?)
       until ``grace_ms`` ends, and after one last re-verification the group gets SIGKILL.
    5. No proof, no signal; a bare pid is never signalled.

    I/O errors other than "no such process" (for instance EPERM) propagate: the caller records the
    stop as failed and writes nothing.
    """

    def __init__(self, *, group_signal_via_pidfd: bool | None = None) -> None:
        """``group_signal_via_pidfd``: None detects kernel support once; False forces the killpg fallback."""
        self._group_flag = group_signal_via_pidfd

    def stop(
        self,
        handle_text: str,
        expected_pid: int | None,
        *,
        grace_ms: int = DEFAULT_GRACE_MS,
        poll_ms: int = DEFAULT_POLL_MS,
    ) -> StopOutcome:
        if type(grace_ms) is not int or not 0 <= grace_ms <= MAX_GRACE_MS:
            raise ValueError("grace_ms out of range")
        if type(poll_ms) is not int or not 1 <= poll_ms <= MAX_POLL_MS:
            raise ValueError("poll_ms out of range")
        try:
            handle = ProcessHandle.decode(handle_text)
        except InvalidHandle:
            return _outcome("invalid")
        if not pidfds_supported():
            return _outcome("unsupported")
        if expected_pid is not None and expected_pid != handle.pid:
            return _outcome("pid_mismatch")
        if handle.pgid != handle.pid:
            return _outcome("identity_mismatch")
        if read_boot_id() != handle.boot_id:
            return _outcome("already_exited")
        try:
            pidfd = os.pidfd_open(handle.pid)
        except ProcessLookupError:
            return _outcome("already_exited")
        try:
            return self._stop_pinned(handle, pidfd, grace_ms, poll_ms)
        finally:
            os.close(pidfd)

    def sweep_orphans(self, handle_text: str) -> int:
        """``kill_orphans`` for a handle in its text form; ``InvalidHandle`` when it does not parse."""
        return kill_orphans(ProcessHandle.decode(handle_text))

    def _stop_pinned(self, handle: ProcessHandle, pidfd: int, grace_ms: int, poll_ms: int) -> StopOutcome:
        verdict = classify(handle, read_stat(handle.pid), read_boot_id())
        if verdict == "exited":
            return _outcome("already_exited")
        if verdict == "mismatch":
            return _outcome("identity_mismatch")
        if not self._signal_group(pidfd, handle.pgid, signal.SIGTERM):
            return _outcome("already_exited")
        deadline = time.monotonic() + grace_ms / 1000
        while True:
            if not self._group_still_ours_and_alive(pidfd, handle.pgid):
                return _outcome("termination_requested", term=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(poll_ms / 1000, remaining))
        killed = self._signal_group(pidfd, handle.pgid, signal.SIGKILL)
        return _outcome("termination_requested", term=True, kill=killed)

    def _signal_group(self, pidfd: int, pgid: int, sig: int) -> bool:
        """Deliver ``sig`` to the verified group; False when the group no longer exists."""
        try:
            if self._group_flag_supported():
                signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
            else:
                # While the leader exists (even as a zombie) its pid, and so the group id, is not reused.
                signal.pidfd_send_signal(pidfd, 0)
                os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        return True

    def _group_still_ours_and_alive(self, pidfd: int, pgid: int) -> bool:
        if not self._signal_group(pidfd, pgid, 0):
            return False
        # The pidfd check pins the group id, so a number-based scan now sees only our group.
        return is_group_alive(pgid)

    def _group_flag_supported(self) -> bool:
        if self._group_flag is None:
            # Probe with our own pid: ESRCH (no group with our pid as its id) still means "flag known".
            own = os.pidfd_open(os.getpid())
            try:
                signal.pidfd_send_signal(own, 0, None, PIDFD_SIGNAL_PROCESS_GROUP)
                self._group_flag = True
            except ProcessLookupError:
                self._group_flag = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._group_flag = False
            finally:
                os.close(own)
        return self._group_flag


def pidfds_supported() -> bool:
    return sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


def is_group_alive(pgid: int) -> bool:
    """True while a process that can still run (not a zombie) belongs to process group ``pgid``.

    Inspection only and number-based: meaningful while something pins the group id (``stop`` checks
    its pidfd first). Zombies do not count: they cannot run, and an init that never reaps keeps them.
    """
    if _live_member(pgid, pgid):
        return True
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and _live_member(int(entry.name), pgid):
                return True
    return False


def _live_member(pid: int, pgid: int) -> bool:
    try:
        stat = read_stat(pid)
    except (ProcStatUnreadable, OSError, ValueError):
        return False
    return stat is not None and stat.pgrp == pgid and stat.state not in EXITED_STATES


MAX_ORPHAN_PASSES = 4


def kill_orphans(handle: ProcessHandle) -> int:
    """SIGKILL what is left of a group whose leader (the shim) is proven gone; returns how many got it.

    For a re-adopted attempt the shim is not our child, so nothing pins its group id once it is reaped.
    A survivor is signalled only on proof that it descends from this attempt: same boot, group *and*
    session id as the shim's pid, started no earlier than the shim, and an initial environment that
    carries this attempt's id. Each one is pinned by a pidfd and re-checked before its KILL, so a pid
    reused meanwhile is never hit. Call it only once ``verify_identity(handle)`` said ``exited``.
    """
    if not pidfds_supported() or read_boot_id() != handle.boot_id:
        return 0
    marker = f"QL3_ATTEMPT_ID={handle.attempt_id}".encode()
    # A KILLed process dies only once it is scheduled again: a later pass may still see it alive and
    # must not count (or signal) it twice. Its identity, pid and start, tells it from a new process.
    signalled: set[tuple[int, str]] = set()
    killed = 0
    for _ in range(MAX_ORPHAN_PASSES):
        found = 0
        with os.scandir("/proc") as entries:
            pids = [int(e.name) for e in entries if e.name.isdigit()]
        for pid in pids:
            if _descent(pid, handle, marker) is None:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                # The pidfd now pins the pid: the same checks again prove it is still that process.
                start = _descent(pid, handle, marker)
                if start is not None and (pid, start) not in signalled:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    signalled.add((pid, start))
                    found += 1
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)
        killed += found
        if found == 0:
            break
    return killed


def _descent(pid: int, handle: ProcessHandle, marker: bytes) -> str | None:
    """The start ticks of ``pid`` when it descends from the handle's attempt, else None."""
    try:
        stat = read_stat(pid)
        if (
            stat is None
            or stat.pgrp != handle.pgid
            or stat.state in EXITED_STATES
            or int(stat.start_ticks) < int(handle.start_ticks)
            or _session_id(pid) != handle.pgid
        ):
            return None
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read(256 * 1024)
    except (ProcStatUnreadable, OSError, ValueError):
        return None
    return stat.start_ticks if marker in environ.split(b"\0") else None


def _session_id(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    return int(raw[raw.rindex(b")") + 2 :].split()[3])


def finish_stop(
    controller: ProcessController, handle_text: str, expected_pid: int | None, /, *, grace_ms: int
) -> StopOutcome:
    """Finish a stop that a crash cut short, for a Run that already ended: the group's leader still
    running gets the whole stop; once it is gone (``already_exited``), whatever survived it in its
    group and session (a child that ignored the TERM) is found by identity and killed
    (``kill_orphans``). The same outcome statuses as ``stop``."""
    outcome = controller.stop(handle_text, expected_pid, grace_ms=grace_ms)
    if outcome.status != "already_exited":
        return outcome
    try:
        handle = ProcessHandle.decode(handle_text)
    except InvalidHandle:
        return _outcome("invalid")
    killed = kill_orphans(handle)
    return _outcome("already_exited", kill=killed > 0)
