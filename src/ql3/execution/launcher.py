"""Start commands under the per-attempt shim, and reap the shims from one watcher thread.

Per run the cost is one ``posix_spawn`` of ``/bin/sh`` (the shim, which is the new session's and
process group's leader) and one fork+exec for the command (``/bin/sh -c`` for a shell command, the
program itself for an argv command); the shim writes the receipt itself, with no further process
(``shim.sh``, ``receipts.py``): no Python interpreter is ever started per run. The shim waits on a
pipe for the start ticks of its own handle, which the launcher sends once it has captured it, so the
shim records its launch identity without reading /proc itself (dash's ``read`` takes one byte per
read(2): some 300 calls for a stat record) and starts nothing if the launcher died first. The shim
lives outside this process, so if the worker dies the command keeps running, its log keeps growing
and its receipt is still published.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import pwd
import re
import select
import shlex
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ql3.domain.execution import ScriptPayload
from ql3.domain.notifications import notify_token
from ql3.domain.scripts import script_digest
from ql3.execution.identity import CaptureFailed, ProcessHandle, capture, read_boot_id
from ql3.execution.logs import MAX_LOG_CAP_BYTES, create_log, enforce_log_cap
from ql3.execution.receipts import (
    MAX_RECEIPT_BYTES,
    InvalidAttemptId,
    check_file_id,
    receipt_prefix,
    receipt_published,
    reserve_receipt,
    unreserve_receipt,
)
from ql3.execution.run_as import TaskUser, TaskUsers
from ql3.ports.execution import ArgvCommand, LaunchFailed, LaunchRejected, LaunchRequest, ShellCommand

ISOLATED_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_ID_CHARS = 255
MAX_ARGS = 4096
# A task's own env (256 entries, 256 KiB) plus its project's variables (128, 256 KiB; docs/variables.md).
MAX_ENV_ENTRIES = 384
MAX_ENV_VALUE_BYTES = 64 * 1024
MAX_ENV_TOTAL_BYTES = 512 * 1024
# The kernel caps every single argv/env string (MAX_ARG_STRLEN); the command travels in one of each.
MAX_ARG_STRLEN = 32 * 4096
SHIM_ENV_PREFIX = "QL3_SHIM_"
DEPENDENCIES_DIR = ".ql3-deps"
HELPERS_DIR = str(resources.files("ql3.execution.helpers"))
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
# The server's own configuration never reaches a task, whatever its environment policy.
SERVER_ONLY_VARS = frozenset({"QL3_HOME", "QL3_DATABASE_URL", "QL3_TOKEN", "QL3_URL"})
_COMMAND_VAR = "QL3_SHIM_COMMAND"
_RECEIPT_TAIL_BYTES = 48
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32,128}")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_TOOL_DIRS = ("/usr/bin", "/bin")
_PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2  # linux/pidfd.h (6.9+)
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Launched:
    """A started attempt.

    ``pidfd`` belongs to the receiver: pass the whole object to ``ExitWatcher.watch`` (which closes it
    after reaping the shim) or close it yourself. Until someone reaps the shim, it stays a zombie.
    """

    handle: ProcessHandle
    pid: int
    pidfd: int
    log_path: Path
    log_cap_bytes: int
    receipt_path: str


class LocalLauncher:
    """Starts each attempt under its own shim (``shim.sh``) as the leader of a new session.

    ``durable_receipts`` adds ``sync(1)`` of the receipt and its directory (two more execs per run);
    without it a power loss may lose a receipt, which ends as ``lost``, never as a wrong exit code.
    """

    def __init__(
        self,
        *,
        shell: str = "/bin/sh",
        durable_receipts: bool = False,
        run_as: TaskUser | None = None,
        task_users: TaskUsers | None = None,
        notify_url: str | None = None,
    ) -> None:
        self._shell = shell
        # Where a task's ``ql3 notify`` / notify.py / sendNotify.js reach the API (docs/notifications.md).
        self._notify_url = notify_url
        # The command (not the shim) runs as the project's task user: docs/security.md ("Run as").
        self._users = task_users if task_users is not None else TaskUsers(default=run_as)
        self._script = resources.files("ql3.execution").joinpath("shim.sh").read_text("utf-8")
        self._boot_id = read_boot_id()
        self._sync = _find_tool("sync") if durable_receipts else ""
        self._home = _home_directory()
        self._sigdef = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
        self._known_dirs: set[str] = set()
        self._scripts_roots: dict[str, str] = {}
        # The command inherits our umask; the shim tightens it only for its own files and restores it.
        self._umask = f"{_current_umask():04o}"

    def start(self, request: LaunchRequest) -> Launched:
        """Spawn the shim; raises ``LaunchRejected`` (bad input) or ``LaunchFailed`` (nothing runs)."""
        head = _validate(request)
        # Plain strings, once per launch (the attempt id was checked as a file name by _validate).
        receipt_dir = os.path.abspath(request.receipt_dir)
        log_name = os.path.abspath(request.log_path)
        log_dir = os.path.dirname(log_name)
        receipt = f"{receipt_dir}/{request.attempt_id}.json"
        identity = f"{receipt_dir}/{request.attempt_id}.launch"
        user = self._users.for_project(request.project_id)
        env = self._child_environment(request, user)
        if request.script is not None:
            env.update(self._write_script(request.script, os.path.dirname(receipt_dir), user))
        if user is None:
            self._add_ql3_command(env, os.path.dirname(receipt_dir))
        env.update(self._shim_variables(request, receipt_dir, receipt, identity, head, user))
        argv = [self._shell, "-c", self._script, "sh"]
        if isinstance(request.command, ArgvCommand):
            argv += [request.command.file, *request.command.args]
        try:
            self._ensure_dir(receipt_dir)
            self._ensure_dir(log_dir)
            log_fd = create_log(log_name)
        except OSError as exc:
            self._known_dirs.difference_update((receipt_dir, log_dir))
            raise LaunchFailed("log_or_receipt_dir_unavailable") from exc
        try:
            # The receipt's space, before anything runs: a disk that fills later cannot cost the exit code.
            reserve_receipt(receipt_dir, request.attempt_id)
        except OSError as exc:
            os.close(log_fd)
            raise LaunchFailed(_reserve_failure(exc)) from exc
        # The shim waits on this pipe (its descriptor 3) for its own start ticks, sent once its
        # identity is captured below: it writes its launch identity from them, then starts the command.
        ticks_r, ticks_w = -1, -1
        try:
            try:
                log_fd = _high_fd(log_fd)
                ticks_r, ticks_w = os.pipe2(os.O_CLOEXEC)
                ticks_r = _high_fd(ticks_r)
                env["QL3_SHIM_CLOCK_BASE"] = str(request.started_at_ms - _boot_time_ms())
                pid = os.posix_spawn(
                    self._shell,
                    argv,
                    env,
                    file_actions=[
                        *_close_inheritable_fds(),
                        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                        (os.POSIX_SPAWN_DUP2, log_fd, 1),
                        (os.POSIX_SPAWN_DUP2, log_fd, 2),
                        (os.POSIX_SPAWN_DUP2, ticks_r, 3),
                    ],
                    setsid=True,
                    setsigmask=(),
                    setsigdef=self._sigdef,
                )
            except OSError as exc:
                raise LaunchFailed("spawn_failed") from exc
        except BaseException:
            _close_all(log_fd, ticks_r, ticks_w)
            unreserve_receipt(receipt_dir, request.attempt_id)
            raise
        # The shim is waiting for its ticks: nothing else comes first, not even closing our copies of
        # its descriptors (every system call is a point where another thread may take the GIL).
        try:
            launched = self._identify(pid, request, Path(log_name), receipt, identity, ticks_w)
        finally:
            _close_all(ticks_w, log_fd, ticks_r)
        return launched

    def _identify(
        self, pid: int, request: LaunchRequest, log_path: Path, receipt: str, identity: str, ticks_w: int
    ) -> Launched:
        # Our unreaped child: its pid (and group id) cannot be reused until we wait for it.
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            _abandon(pid, None, identity, receipt)
            raise LaunchFailed("pidfd_unavailable") from exc
        try:
            handle = capture(pid, request.attempt_id, boot_id=self._boot_id, allow_zombie=True)
        except CaptureFailed as exc:
            # Without a handle nothing could ever stop it or prove its exit; end it now.
            _abandon(pid, pidfd, identity, receipt)
            raise LaunchFailed("capture_failed") from exc
        _send_ticks(ticks_w, handle.start_ticks)
        return Launched(
            handle=handle,
            pid=pid,
            pidfd=pidfd,
            log_path=log_path,
            log_cap_bytes=request.log_cap_bytes,
            receipt_path=receipt,
        )

    def _child_environment(self, request: LaunchRequest, user: TaskUser | None) -> dict[str, str]:
        if request.environment_policy == "isolated":
            env = {"PATH": ISOLATED_PATH, "HOME": self._home, "LANG": "C.UTF-8"}
        else:
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(SHIM_ENV_PREFIX) and k not in SERVER_ONLY_VARS
            }
        if user is not None:
            env.update(user.environment())
        env.update(request.environment)
        for prefix in ("QL3_", "QL_"):
            env[prefix + "RUN_ID"] = request.run_id
            env[prefix + "ATTEMPT_ID"] = request.attempt_id
            # The callback token stays with the shim (in its receipt's head): a task never calls back
            # with it, and `env` in a task would write it into a log every viewer may read. A task
            # cannot set it either (docs/security.md "What a task sees"); its notify credential is
            # derived from it one way (``add_notify``).
            env.pop(prefix + "CALLBACK_TOKEN", None)
        add_dependencies(env, user.home if user is not None else self._home, request.project_id)
        add_notify(env, request, self._notify_url)
        return env

    def _shim_variables(
        self,
        request: LaunchRequest,
        receipt_dir: str,
        receipt: str,
        identity: str,
        head: str,
        user: TaskUser | None,
    ) -> dict[str, str]:
        command = request.command
        return {
            "QL3_SHIM_MODE": "argv" if isinstance(command, ArgvCommand) else "shell",
            _COMMAND_VAR: command.command if isinstance(command, ShellCommand) else "",
            "QL3_SHIM_CWD": request.working_directory or "",
            "QL3_SHIM_SH": self._shell,
            "QL3_SHIM_HEAD": head,
            "QL3_SHIM_STARTED": str(request.started_at_ms),
            "QL3_SHIM_DST": receipt,
            "QL3_SHIM_DIR": receipt_dir,
            "QL3_SHIM_SYNC": self._sync,
            "QL3_SHIM_BOOT": self._boot_id,
            "QL3_SHIM_UMASK": self._umask,
            "QL3_SHIM_IDENTITY": identity,
            "QL3_SHIM_AS": user.command_prefix() if user is not None else "",
        }

    def _write_script(self, script: ScriptPayload, home: str, user: TaskUser | None) -> dict[str, str]:
        """Write the offer's script once per content (a file named by its digest never changes) and
        return the variables that name it. Refuses a missing script and content that does not match
        its digest (checked again here: the embedded worker's offer did not cross the wire).

        Without a task user the file goes under ``<home>/scripts/<digest>/`` (0600). With one, the
        task user cannot enter ``home`` (0700), so it goes under the task scripts root
        (``task_scripts_root``): root-owned directories the task user may traverse but not list or
        write, and a file owned by the worker's user, group the task user's, 0750 (docs/scripts.md)."""
        if script.content is None:
            raise LaunchRejected("script_missing")
        if not _DIGEST_RE.fullmatch(script.digest) or script_digest(script.content) != script.digest:
            raise LaunchRejected("script_digest")
        name = os.path.basename(script.path)
        try:
            if user is None:
                folder = os.path.join(home, "scripts", script.digest)
                target = os.path.join(folder, name)
                if not os.path.exists(target):
                    os.makedirs(folder, mode=0o700, exist_ok=True)
                    tmp = f"{target}.{os.getpid()}.tmp"
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "w", encoding="utf-8") as out:
                        out.write(script.content)
                    os.rename(tmp, target)
            else:
                target = _write_task_user_script(
                    self._task_scripts_root(home), user, script.digest, name, script.content
                )
        except OSError as exc:
            raise LaunchFailed("script_unwritable") from exc
        return {"QL3_SCRIPT": target, "QL3_SCRIPT_PATH": script.path}

    def _task_scripts_root(self, home: str) -> str:
        """``task_scripts_root(home)``, or, when another user made that path first (the temporary
        directory is everyone's), a fresh one of this process's own (``mkdtemp``), kept for its life."""
        root = self._scripts_roots.get(home)
        if root is None:
            root = task_scripts_root(home)
            try:
                _owned_dir(root, 0o711, -1)
            except OSError:
                root = tempfile.mkdtemp(prefix=f"ql3-scripts-{os.geteuid()}-")
            self._scripts_roots[home] = root
        return root

    def _add_ql3_command(self, env: dict[str, str], home: str) -> None:
        """Append ``<worker home>/bin`` to the task's ``PATH``: it holds a ``ql3`` command that runs
        this worker's own ql3, so a script's ``ql3 notify`` works whatever the task's PATH (an isolated
        task's is ``/usr/local/bin:/usr/bin:/bin``). Appended, so a ``ql3`` earlier on the PATH wins.
        Only for tasks run as the worker's user: a task user cannot read ``$QL3_HOME``
        (docs/notifications.md)."""
        folder = os.path.join(home, "bin")
        if folder not in self._known_dirs:
            if not sys.executable:
                return
            target = os.path.join(folder, "ql3")
            text = f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ql3.cli.main "$@"\n'
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                current = None
                if os.path.exists(target):
                    with open(target, encoding="utf-8") as found:
                        current = found.read()
                if current != text:
                    tmp = f"{target}.{os.getpid()}.tmp"
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
                    with os.fdopen(fd, "w", encoding="utf-8") as out:
                        out.write(text)
                    os.rename(tmp, target)
            except OSError:
                return  # the task still runs; only a bare `ql3` is not found
            self._known_dirs.add(folder)
        env["PATH"] = os.pathsep.join(p for p in (env.get("PATH", ""), folder) if p)

    def _ensure_dir(self, path: str) -> None:
        if path not in self._known_dirs:
            os.makedirs(path, mode=0o700, exist_ok=True)
            self._known_dirs.add(path)


TASK_SCRIPT_MODE = 0o750
MAX_TASK_SCRIPT_BYTES = 256 * 1024
_TASK_DIR_MODE = 0o710


def task_scripts_root(home: str) -> str:
    """Where scripts for task users go on this host: a directory of the temporary directory named by
    the worker's uid and home (one per worker home, kept across restarts), root-owned 0711 (the task
    user may traverse it, not list it). ``_owned_dir`` refuses one that someone else made."""
    tag = hashlib.sha256(os.path.abspath(home).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ql3-scripts-{os.geteuid()}-{tag}")


def _owned_dir(path: str, mode: int, gid: int) -> None:
    """``path`` is a real directory of ours (never a link followed) with exactly ``mode`` and group
    ``gid``, created if missing; ``OSError`` if it is anything else (another user's, a symlink)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise PermissionError(errno.EPERM, "not owned by the worker's user", path)
        if st.st_gid != gid and gid >= 0:
            os.fchown(fd, -1, gid)
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _holds(target: str, digest: str, gid: int) -> bool:
    """``target`` is our regular file, group ``gid``, mode ``TASK_SCRIPT_MODE``, one link, and its
    content matches ``digest``: checked before every launch that uses it."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # missing, or a link (O_NOFOLLOW): rewritten
        return False
    try:
        st = os.fstat(fd)
        if not (
            stat.S_ISREG(st.st_mode)
            and st.st_uid == os.geteuid()
            and st.st_gid == gid
            and stat.S_IMODE(st.st_mode) == TASK_SCRIPT_MODE
            and st.st_nlink == 1
            and st.st_size <= MAX_TASK_SCRIPT_BYTES
        ):
            return False
        data = os.read(fd, MAX_TASK_SCRIPT_BYTES + 1)
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest() == digest


def _write_task_user_script(root: str, user: TaskUser, digest: str, name: str, content: str) -> str:
    """The script for ``user`` at ``root/<uid>/<digest>/<name>``: root 0711 (ours), the user's
    directory and the digest's 0710 with the user's group, the file 0750 with the user's group and our
    owner. The task user reads and executes it; it can neither write it nor any directory above it, so
    the content it runs is the one whose digest was checked. A file that is not exactly that (changed,
    another mode or owner, a link) is replaced."""
    _owned_dir(root, 0o711, -1)
    folder = os.path.join(root, str(user.uid))
    _owned_dir(folder, _TASK_DIR_MODE, user.gid)
    folder = os.path.join(folder, digest)
    _owned_dir(folder, _TASK_DIR_MODE, user.gid)
    target = os.path.join(folder, name)
    if _holds(target, digest, user.gid):
        return target
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchown(fd, -1, user.gid)
        os.fchmod(fd, TASK_SCRIPT_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            fd = -1
            out.write(content)
        os.rename(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not _holds(target, digest, user.gid):
        raise PermissionError(errno.EPERM, "the script file does not hold its content", target)
    return target


def dependencies_dir(home: str, project_id: str | None) -> str:
    """Where a project's dependency sets live on this host: under the home of the user its tasks run
    as, one directory per project (docs/dependencies.md)."""
    return os.path.join(home, DEPENDENCIES_DIR, project_id or "no-project")


def add_dependencies(env: dict[str, str], home: str, project_id: str | None) -> None:
    """``QL3_DEPS_DIR`` for the install run; once a set is installed (``current`` exists), its
    virtualenv's ``bin`` and ``node_modules/.bin`` go first on ``PATH`` and its ``node_modules`` on
    ``NODE_PATH``."""
    root = dependencies_dir(home, project_id)
    env["QL3_DEPS_DIR"] = root
    current = os.path.join(root, "current")
    if not os.path.isdir(current):
        return
    env["PATH"] = os.pathsep.join(
        p for p in (f"{current}/venv/bin", f"{current}/node_modules/.bin", env.get("PATH", "")) if p
    )
    env["NODE_PATH"] = os.pathsep.join(p for p in (f"{current}/node_modules", env.get("NODE_PATH", "")) if p)


def add_notify(env: dict[str, str], request: LaunchRequest, notify_url: str | None) -> None:
    """The run's notify credential and the helpers scripts import (``from notify import send``,
    ``require('sendNotify')``), after the task's own ``PYTHONPATH``/``NODE_PATH`` so that a script's
    own module of that name wins. The credential is the attempt's (``notify_token``): it is valid only
    while this attempt runs, and no credential of the worker reaches the task."""
    env["QL3_NOTIFY_TOKEN"] = notify_token(request.attempt_id, request.callback_token)
    if notify_url:
        env["QL3_NOTIFY_URL"] = notify_url
    for key in ("PYTHONPATH", "NODE_PATH"):
        env[key] = os.pathsep.join(p for p in (env.get(key, ""), HELPERS_DIR) if p)


def _prefix(request: LaunchRequest) -> str:
    return receipt_prefix(
        run_id=request.run_id,
        attempt_id=request.attempt_id,
        callback_sequence=request.callback_sequence,
        token=request.callback_token,
        started_at_ms=request.started_at_ms,
    )


def _validate(request: LaunchRequest) -> str:
    """Raise ``LaunchRejected`` for bad input; return the receipt's prefix (it is checked for size)."""
    if not _text(request.run_id, MAX_ID_CHARS):
        raise LaunchRejected("run_id")
    try:
        check_file_id(request.attempt_id)
    except InvalidAttemptId as exc:
        raise LaunchRejected("attempt_id") from exc
    if type(request.callback_token) is not str or _TOKEN_RE.fullmatch(request.callback_token) is None:
        raise LaunchRejected("callback_token")
    if type(request.callback_sequence) is not int or request.callback_sequence < 0:
        raise LaunchRejected("callback_sequence")
    if type(request.started_at_ms) is not int or request.started_at_ms < 0:
        raise LaunchRejected("started_at_ms")
    if type(request.log_cap_bytes) is not int or not 1 <= request.log_cap_bytes <= MAX_LOG_CAP_BYTES:
        raise LaunchRejected("log_cap_bytes")
    if request.environment_policy not in ("inherit", "isolated"):
        raise LaunchRejected("environment_policy")
    if not _valid_command(request.command):
        raise LaunchRejected("command")
    cwd = request.working_directory
    if cwd is not None and not (_text(cwd, 4096) and os.path.isabs(cwd) and os.path.isdir(cwd)):
        raise LaunchRejected("working_directory")
    if not _valid_environment(request.environment):
        raise LaunchRejected("environment")
    head = _prefix(request)
    if len(head.encode("utf-8")) + _RECEIPT_TAIL_BYTES > MAX_RECEIPT_BYTES:
        raise LaunchRejected("receipt_too_large")
    return head


def _text(value: object, max_bytes: int) -> bool:
    if type(value) is not str or not value or "\x00" in value:
        return False
    try:
        return len(value.encode("utf-8")) <= max_bytes
    except UnicodeEncodeError:
        return False


def _valid_command(command: object) -> bool:
    if isinstance(command, ShellCommand):
        return _text(command.command, MAX_ARG_STRLEN - len(_COMMAND_VAR) - 2)
    if isinstance(command, ArgvCommand):
        return (
            _text(command.file, 4096)
            and not command.file.startswith("-")
            and type(command.args) is tuple
            and len(command.args) <= MAX_ARGS
            and all(a == "" or _text(a, MAX_ARG_STRLEN - 1) for a in command.args)
        )
    return False


def _valid_environment(environment: object) -> bool:
    if not isinstance(environment, Mapping) or len(environment) > MAX_ENV_ENTRIES:
        return False
    total = 0
    for key, value in environment.items():
        if type(key) is not str or _ENV_KEY_RE.fullmatch(key) is None or key.startswith(SHIM_ENV_PREFIX):
            return False
        if not (value == "" or _text(value, MAX_ENV_VALUE_BYTES)):
            return False
        total += len(key) + len(value.encode("utf-8")) + 2
    return total <= MAX_ENV_TOTAL_BYTES


def _find_tool(name: str) -> str:
    for directory in _TOOL_DIRS:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    raise LaunchFailed("tool_missing")


def _home_directory() -> str:
    home = os.environ.get("HOME")
    if home:
        return home
    try:
        return pwd.getpwuid(os.getuid()).pw_dir or "/"
    except KeyError:
        return "/"


def _close_inheritable_fds() -> list[tuple[int, int]]:
    """Close actions for stray inheritable descriptors (posix_spawn has no close_fds)."""
    actions = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                pass  # closed meanwhile (it was the listdir's own descriptor, for one)
    return actions


def _close_all(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _high_fd(fd: int) -> int:
    """``fd`` moved above 3 (close-on-exec kept): the spawn dup2s onto 0-3, and dup2 of a descriptor
    onto itself would not clear its close-on-exec flag."""
    if fd > 3:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 4)
    os.close(fd)
    return high


def _send_ticks(fd: int, ticks: str) -> None:
    """The shim's start ticks, one line (far below PIPE_BUF: one write, never partial)."""
    try:
        os.write(fd, f"{ticks}\n".encode("ascii"))
    except BrokenPipeError:
        pass  # the shim is gone already: the exit watcher reports it, with no receipt


def _current_umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _boot_time_ms() -> int:
    # The clock behind /proc/uptime, which the shim reads for finishedAtMs.
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


def _has_exited(pidfd: int) -> bool:
    """True once our child behind ``pidfd`` has exited; never reaps it (``WNOWAIT``)."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # reaped elsewhere (e.g. SIGCHLD ignored); the pidfd already said it exited
    return info is not None and info.si_pid != 0


def _kill_pinned_group(pidfd: int, pid: int) -> None:
    """SIGKILL the group led by our unreaped child ``pid``: while it is a zombie, neither its pid nor its
    group id can be reused, so the group reached is the child's own."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL, None, _PIDFD_SIGNAL_PROCESS_GROUP)
    except ProcessLookupError:
        return
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        try:
            os.killpg(pid, signal.SIGKILL)  # kernels before 6.9: the zombie still pins the group id
        except ProcessLookupError:
            return


def _abandon(pid: int, pidfd: int | None, identity: str, receipt: str) -> None:
    """End a shim that never got its ticks, and remove the identity file it made empty for them and
    the receipt's reservation (it never started the command, so it never wrote there)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    if pidfd is not None:
        os.close(pidfd)
    for path in (identity, receipt):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _reserve_failure(exc: OSError) -> str:
    """The ``LaunchFailed`` reason of a receipt that could not be reserved (nothing was started)."""
    if isinstance(exc, FileExistsError):
        return "receipt_exists"  # an earlier receipt of this attempt id: never replaced
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "receipt_space_unavailable"
    return "log_or_receipt_dir_unavailable"


class ExitWatcher:
    """Reaps launched shims and reports each exit, from one background thread.

    ``start()`` creates the thread and ``stop()`` ends it; nothing creates a thread per run. The thread
    sleeps in ``epoll`` over the shims' pidfds and a self-pipe; idle, it blocks without a timeout.
    ``watch`` adds the pidfd to the epoll set itself, from the caller's thread, so a busy watcher is not
    woken once per run to register it: the self-pipe is written only to wake a thread asleep without a
    timeout (nothing was watched: it must start its log checks) and by ``stop``. While attempts run it
    also wakes every ``log_check_interval_s`` to cut logs that outgrew their cap. On each exit, a shim
    that left no receipt first takes its group along (SIGKILL through its pidfd while it is still an
    unreaped zombie, so the group cannot be another's); then it reaps the shim, cuts the log to its
    cap and calls ``on_exit(attempt_id)`` on the watcher thread (keep it short).
    Errors go to ``on_error`` (or the module logger) and never stop the thread.

    Only children of this process can be reaped. After a restart, shims started by a previous
    incarnation are not our children: callers fall back to ``identity.probe`` of the stored handle and
    ``receipts.read_receipt``. Shims still watched at ``stop()`` are left running, unreaped.
    """

    def __init__(
        self,
        on_exit: Callable[[str], None],
        *,
        log_check_interval_s: float = 1.0,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if not 0 < log_check_interval_s <= 3600:
            raise ValueError("log_check_interval_s out of range")
        self._on_exit = on_exit
        self._on_error = on_error
        self._interval = log_check_interval_s
        self._lock = threading.Lock()
        # pidfd -> attempt: added by ``watch`` (any thread), removed by the watcher thread only.
        self._watched: dict[int, Launched] = {}
        self._epoll: select.epoll | None = None
        self._asleep = False  # the thread is (about to be) blocked without a timeout
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._wake_r = -1
        self._wake_w = -1

    @property
    def pending(self) -> int:
        """Attempts handed to ``watch`` whose exit has not been reported yet."""
        with self._lock:
            return len(self._watched)

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("exit watcher already started")
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._epoll = select.epoll()  # close-on-exec
            self._epoll.register(self._wake_r, select.EPOLLIN)
            self._stopping = False
            self._asleep = False
            self._thread = threading.Thread(target=self._run, name="ql3-exit-watcher", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            thread = self._thread
            if thread is None or self._stopping:
                return
            self._stopping = True
            self._wake_locked()
        thread.join(timeout_s)
        with self._lock:
            if not thread.is_alive():
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._thread = None

    def watch(self, launched: Launched) -> None:
        """Take ownership of ``launched.pidfd`` and report its exit once. Raises if not running."""
        failure: OSError | None = None
        with self._lock:
            if self._thread is None or self._stopping or self._epoll is None:
                raise RuntimeError("exit watcher is not running")
            try:
                # epoll_ctl while the watcher thread waits in epoll_wait is safe: the wait sees it.
                self._epoll.register(launched.pidfd, select.EPOLLIN)
            except OSError as exc:
                failure = exc
            else:
                self._watched[launched.pidfd] = launched
                if self._asleep:
                    self._asleep = False
                    self._wake_locked()
        if failure is not None:
            self._report(failure)

    def _wake_locked(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full, so a wake-up is already pending

    def _run(self) -> None:
        epoll = self._epoll
        assert epoll is not None
        next_check: float | None = None
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    busy = bool(self._watched)
                    # Asleep without a timeout only while nothing is watched; watch() wakes us then.
                    self._asleep = not busy
                now = time.monotonic()
                if not busy:
                    next_check = None
                elif next_check is None:
                    next_check = now + self._interval
                elif now >= next_check:
                    with self._lock:
                        running = list(self._watched.values())
                    self._enforce_caps(running)
                    next_check = now + self._interval
                timeout = None if next_check is None else max(0.0, next_check - time.monotonic())
                for fd, _ in epoll.poll(timeout):
                    if fd == self._wake_r:
                        self._drain_wake_pipe()
                        continue
                    item = self._watched.get(fd)  # only this thread removes entries
                    if item is not None:
                        self._collect(epoll, item)
        finally:
            with self._lock:
                leftovers = list(self._watched.values())
                self._watched.clear()
                self._epoll = None
            for launched in leftovers:
                os.close(launched.pidfd)
            epoll.close()

    def _collect(self, epoll: select.epoll, item: Launched) -> None:
        # Has it exited? Ask without reaping (WNOWAIT): the zombie keeps the group's identity pinned.
        if not _has_exited(item.pidfd):
            return
        # Still unreaped, the shim pins its pid and group id. A shim that exited without publishing its
        # receipt (its reservation still empty, or cut short) was killed: the rest of its group must
        # not outlive it.
        if not receipt_published(item.receipt_path):
            try:
                _kill_pinned_group(item.pidfd, item.pid)
            except OSError as exc:
                self._report(exc)
        self._reap(item)
        with self._lock:
            epoll.unregister(item.pidfd)
            del self._watched[item.pidfd]
        os.close(item.pidfd)
        try:
            enforce_log_cap(item.log_path, item.log_cap_bytes)
        except OSError as exc:
            self._report(exc)
        try:
            self._on_exit(item.handle.attempt_id)
        except Exception as exc:
            self._report(exc)

    @staticmethod
    def _reap(item: Launched) -> None:
        try:
            os.waitpid(item.pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def _enforce_caps(self, items: Iterable[Launched]) -> None:
        for item in items:
            try:
                enforce_log_cap(item.log_path, item.log_cap_bytes)
            except OSError as exc:
                self._report(exc)

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _report(self, exc: BaseException) -> None:
        if self._on_error is None:
            _log.warning("exit watcher error", extra={"action": "execution.exit_watcher_error"}, exc_info=exc)
            return
        try:
            self._on_error(exc)
        except Exception:
            _log.warning(
                "exit watcher error handler failed", extra={"action": "execution.exit_watcher_error"}
            )
