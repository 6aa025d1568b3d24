"""``ql3 worker --server URL --token-file F``: a remote worker of a cluster (docs/cluster.md), and
``ql3 worker token create|list|revoke``: its credentials (owner, or admin of the default project)."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import TYPE_CHECKING, Final

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, quiet_flag, wants_json, wants_quiet
from ql3.cli.disk import require_free_space, starting
from ql3.cli.errors import EXIT_ERROR, EXIT_OK, UsageError
from ql3.cli.units import Unit, current_user, kept_environment, ql3_program
from ql3.domain.ids import is_id

if TYPE_CHECKING:
    from ql3.bootstrap import TaskUser, TaskUsers

WORKER_EPILOG: Final = """\
a remote worker (no database credentials; docs/cluster.md):
  ql3 worker token create w1 > w1.token && chmod 600 w1.token     # on a machine with owner credentials
  ql3 worker --server http://cp-a:5700 --token-file w1.token --slots 4 --label zone=a
  SIGTERM drains (no new runs, the runs in progress finish); a second SIGTERM stops at once (the
  runs keep going and are re-adopted by the next start with the same --home)
  QL3_RUN_LEASE_MS (5000-600000, default 30000): the run and session leases this worker renews; a
  run it cannot renew for half of it is stopped on this host
  QL3_LOG_CAP_BYTES (1024-1099511627776, default 16 MiB): the cap of each attempt's log on this host;
  the log is shipped to the server, which keeps as much as its own QL3_LOG_CAP_BYTES (give both the
  same value), so `ql3 run logs` works from any replica
  --run-as USER (start as root): tasks run as USER, who cannot read the token file, --home (journal,
  receipts, logs) or signal the worker; without it a warning says that every task can read them
  the first registration binds the worker's labels to its credential: other labels are refused
  (labels_not_approved) until an admin runs `ql3 worker approve ID` (docs/security.md)
keep it running: ql3 worker --server ... --token-file ... --print-systemd-unit > ql3-worker.service
exit status: 74 when --home is on a disk with less than 1 MiB free (one line names it); 64 for bad
  flags or a token file others can read; 1 when the server refuses the credential or the labels
"""


def _slots(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError("must be 1-1024")
    return value


def read_token_file(path: str) -> str:
    """The worker token, from a file only its owner can read (exit 64 otherwise)."""
    try:
        info = os.stat(path)
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise UsageError(f"--token-file {path}: cannot be read", code="bad_token_file") from None
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise UsageError(
            f"--token-file {path}: readable by others (chmod 600 it)", code="token_file_not_private"
        )
    if info.st_uid not in (os.geteuid(), 0):
        # its owner may read it whatever its mode: a task user's own file is the task's to read
        raise UsageError(
            f"--token-file {path}: owned by uid {info.st_uid}, not by this worker's user (chown it)",
            code="token_file_not_private",
        )
    if not text or len(text) > 256 or not text.isascii() or any(c.isspace() for c in text):
        raise UsageError(f"--token-file {path}: not a token", code="bad_token_file")
    return text


def require_private_worker_home(home: Path) -> None:
    """Refuse (exit 64) a worker home that exists and that group or others may enter: its journal,
    receipts and logs are the worker's alone (a missing one is created 0700)."""
    try:
        info = os.stat(home)
    except FileNotFoundError:
        return
    except OSError:
        raise UsageError(f"--home {home}: cannot be read", code="home_not_directory") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"--home {home}: not a directory", code="home_not_directory")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077 or info.st_uid not in (os.geteuid(), 0):
        raise UsageError(
            f"--home {home} has mode {mode:04o} and owner uid {info.st_uid}: only this worker's user"
            f" may reach its journal, receipts and logs; run `chmod 700 {home}` (and chown it)",
            code="home_not_private",
        )


def worker_task_users(args: argparse.Namespace) -> TaskUsers | None:
    """``--run-as`` and ``--project-run-as`` resolved as ``ql3 serve`` does (exit 64 when a user cannot
    be switched to); None when every task runs as this worker's own user, which is said once."""
    from ql3.bootstrap import TaskUsers
    from ql3.cli.server import _project_users, _task_user

    default = _task_user(args.run_as, allow_server_user=args.allow_server_user, who="worker")
    by_id: dict[str, TaskUser | None] = {}
    for project_id, user in _project_users(
        args.project_run_as or [], allow_server_user=args.allow_server_user
    ):
        if not is_id(project_id):
            raise UsageError(
                f"--project-run-as: {project_id!r} is not a project id: a remote worker cannot look"
                " project names up, give the id (ql3 project list --json)",
                code="bad_run_as",
            )
        if project_id in by_id:
            raise UsageError(f"--project-run-as: project {project_id} given twice", code="bad_run_as")
        by_id[project_id] = user
        if user is None:
            output.note(
                f"warning: tasks of project {project_id} run as this worker's own user"
                " (--allow-server-user): they can read its credential and home (docs/security.md)"
            )
    if default is None and not any(by_id.values()):
        return None
    return TaskUsers(default=default, projects=MappingProxyType(by_id))


# The environment a worker reads, kept in its unit when set where the unit is printed.
WORKER_ENV: Final = ("QL3_RUN_LEASE_MS", "QL3_LOG_CAP_BYTES")


def unit_user(args: argparse.Namespace) -> str:
    """The user the worker starts as: the one printing the unit, or root when it runs its tasks as
    another user (``--run-as``: only root can switch to it)."""
    return (
        "root" if getattr(args, "run_as", None) or getattr(args, "project_run_as", None) else current_user()
    )


def systemd_unit(args: argparse.Namespace, home: Path, labels: dict[str, str]) -> str:
    """A systemd unit that runs this very worker: the same binary, servers, credential file, slots,
    labels, home and QL3_* settings (every path absolute)."""
    command = [*ql3_program(), "worker"]
    for url in args.server:
        command += ["--server", url]
    command += ["--token-file", str(Path(args.token_file).absolute()), "--slots", str(args.slots)]
    for key, value in labels.items():
        command += ["--label", f"{key}={value}"]
    command += ["--home", str(home)]
    if args.ca is not None:
        command += ["--ca", str(Path(args.ca).absolute())]
    if getattr(args, "run_as", None):
        command += ["--run-as", str(args.run_as)]
    for project_id, user in getattr(args, "project_run_as", None) or []:
        command += ["--project-run-as", f"{project_id}={user}"]
    if getattr(args, "allow_server_user", False):
        command += ["--allow-server-user"]
    return Unit(
        name="ql3-worker",
        description="ql3 remote worker",
        command=command,
        user=unit_user(args),
        environment=kept_environment(os.environ, WORKER_ENV),
        stop_notes=[
            "SIGTERM drains: no new runs, the runs in progress finish, then the worker goes offline.",
            "Past TimeoutStopSec systemd kills the worker's own process only: its runs keep going and",
            "are re-adopted by the next start (within QL3_RUN_LEASE_MS / 2, or the host executor",
            "stops them). Raise TimeoutStopSec to let long runs finish on every stop.",
        ],
        stop_timeout_s=60,
        no_restart={64: "bad arguments or settings, or a token file others can read"},
    ).render()


def cmd_remote_worker(args: argparse.Namespace) -> int:
    from ql3.application.settings import resolve_home
    from ql3.application.worker_labels import LabelsNotApproved
    from ql3.bootstrap import fault_injector, task_launcher
    from ql3.cli import logformat
    from ql3.cli.private import private_umask
    from ql3.cli.server import _labels
    from ql3.cluster.http_control_plane import HttpControlPlane
    from ql3.cluster.remote import RemoteWorker
    from ql3.domain.errors import PermissionDenied, Ql3Error, ValidationFailed
    from ql3.ports.control_plane import ControlPlaneUnreachable
    from ql3.worker.config import WorkerConfig

    if not args.server:
        raise UsageError("give an ACTION (list, show, drain, token) or --server URL --token-file FILE")
    for url in args.server:
        if not url.startswith(("http://", "https://")):
            raise UsageError("--server must be an http:// or https:// URL")
    if args.token_file is None:
        raise UsageError("--server needs --token-file FILE (ql3 worker token create NAME)")
    if args.ca is not None and not Path(args.ca).is_file():
        raise UsageError(f"--ca {args.ca}: no such file")
    from ql3.application.settings import LOG_CAP, RUN_LEASE, SettingsError

    try:
        # The leases this worker asks for when it renews, and its session lease (5 s - 10 min).
        lease_ms = RUN_LEASE.parse(os.environ)
        log_cap_bytes = LOG_CAP.parse(os.environ)
    except SettingsError as exc:
        raise UsageError(exc.message, code=exc.code) from None
    token = read_token_file(args.token_file)
    labels = _labels(args.label)
    home = Path(args.home) if args.home else resolve_home(os.environ) / "remote-worker"
    if not home.is_absolute():
        raise UsageError("--home must be an absolute path")
    if args.print_systemd_unit:
        sys.stdout.write(systemd_unit(args, home, labels))
        return EXIT_OK
    require_private_worker_home(home)
    require_free_space([home])  # its journal, receipts and logs: exit 74 with one line when full
    task_users = worker_task_users(args)
    private_umask()
    logformat.configure(sys.stderr)
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per long-poll is noise
    stop_now = threading.Event()
    drain = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if drain.is_set():
            stop_now.set()
        drain.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    plane = HttpControlPlane(args.server, token, ca=args.ca)
    worker_id = None
    delay = 0.2
    while worker_id is None and not drain.is_set():
        try:
            worker_id = plane.identity(window_s=5.0)
        except ControlPlaneUnreachable:
            output.note(f"ql3 worker: {', '.join(args.server)} unreachable, retrying")
            drain.wait(delay)
            delay = min(10.0, delay * 2)
        except Ql3Error as exc:
            plane.close()
            output.note(f"ql3 worker: the server refused the credential ({exc.code})")
            return EXIT_ERROR
    if worker_id is None:
        plane.close()
        return EXIT_OK
    try:
        config = WorkerConfig(
            worker_id=worker_id,
            home=home,
            slots=args.slots,
            labels=labels,
            journal_capacity=max(64, args.slots),
            run_lease_ms=lease_ms,
            session_lease_ms=lease_ms,
            log_cap_bytes=log_cap_bytes,
        )
    except ValidationFailed as exc:
        plane.close()
        raise UsageError(exc.message) from None
    remote = RemoteWorker(
        plane,
        config,
        fault=fault_injector(os.environ.get("QL3_FAULT") or None),
        launcher=None if task_users is None else task_launcher(task_users, notify_url=plane.server),
        # A task's ql3 notify reaches the API of the replica this worker first named.
        notify_url=plane.server,
    )
    try:
        started = starting([home], lambda: EXIT_OK if remote.start() else EXIT_ERROR)
    except PermissionDenied as exc:
        remote.stop(offline=False)
        if exc.details.get("code") != LabelsNotApproved.code:
            raise
        labels_text = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"
        output.note(
            f"ql3 worker {worker_id}: the server refused these labels ({labels_text}): they are not the"
            f" ones approved for {worker_id}; an admin approves them with `ql3 worker approve"
            f" {worker_id}` (labels_not_approved)"
        )
        return EXIT_ERROR
    if started != EXIT_OK:
        remote.stop(offline=False)
        return EXIT_OK
    output.note(f"ql3 worker {worker_id} pulling from {plane.server} with {args.slots} slots; home {home}")
    drain.wait()
    remote.drain()
    output.note(f"ql3 worker {worker_id}: draining ({remote.agent.active_count} runs in progress)")
    while not stop_now.is_set() and not remote.wait_drained(timeout_s=1.0):
        pass
    remote.stop(offline=not stop_now.is_set())
    return EXIT_OK


# -- credentials ---------------------------------------------------------------------------------------


def cmd_token_create(args: argparse.Namespace) -> int:
    from ql3.cli.server import _labels

    body: dict[str, object] = {"workerId": args.worker}
    if args.expires_in is not None:
        body["expiresInS"] = args.expires_in
    if args.label:
        body["labels"] = _labels(args.label)
    with ApiClient.from_environment() as api:
        _, issued = api.call("POST", "/worker-tokens", json=body)
    if wants_json(args):
        output.emit_json(issued)
    else:
        output.note(
            f"worker token {issued['id']} for worker {issued['worker_id']} (shown once; keep it 0600)"
        )
        output.line(str(issued["token"]))
    return EXIT_OK


def cmd_token_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", "/worker-tokens", params={"after": args.after or ""})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    if wants_quiet(args):
        output.ids_only(str(t["id"]) for t in page["items"])
        return EXIT_OK
    output.table(
        ("ID", "WORKER", "REVOKED"),
        [(t["id"], t["worker_id"], "yes" if t["revoked_at_ms"] else "no") for t in page["items"]],
    )
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, record = api.call("POST", f"/worker-tokens/{seg(args.id)}/revoke")
    if wants_json(args):
        output.emit_json(record)
    else:
        output.line(f"worker token {record['id']} ({record['worker_id']}) revoked")
    return EXIT_OK


def _labels_text(labels: dict[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "(none)"


def cmd_approve(args: argparse.Namespace) -> int:
    """Approve the worker's pending request (the labels of its last refused registration, shown
    here as approved), or exactly ``--label`` / ``--no-labels``."""
    from ql3.cli.server import _labels

    if args.label and args.no_labels:
        raise UsageError("give --label or --no-labels, not both")
    path = f"/worker-labels/{seg(args.worker)}"
    with ApiClient.from_environment() as api:
        if args.label or args.no_labels:
            labels = _labels(args.label)
        else:
            _, current = api.call("GET", path)
            if current["requested_labels"] is None:
                raise UsageError(
                    f"worker {args.worker} has no refused registration to approve (its labels:"
                    f" {_labels_text(current['labels'])}); give --label KEY=VALUE or --no-labels",
                    code="no_pending_labels",
                )
            labels = current["requested_labels"]
        _, approved = api.call("POST", f"{path}/approve", json={"labels": labels})
    if wants_json(args):
        output.emit_json(approved)
    else:
        output.line(
            f"worker {approved['worker_id']} may register with labels {_labels_text(approved['labels'])}"
        )
    return EXIT_OK


def register(group: Parser, actions: Subparsers) -> None:
    """Adds the remote-worker flags to the ``worker`` group, its ``token`` actions and ``approve``."""
    from ql3.cli.server import _label, _project_user

    group.description = "Workers: inspect and drain them, or run this machine as a remote worker."
    group.epilog = WORKER_EPILOG
    group.formatter_class = argparse.RawDescriptionHelpFormatter
    group.set_defaults(handler=cmd_remote_worker, parser=group)
    group.add_argument(
        "--server",
        metavar="URL",
        action="append",
        default=None,
        help="run a remote worker of this control plane; repeat it with other replicas' URLs to move"
        " on to the next one when a replica cannot be reached",
    )
    group.add_argument("--token-file", metavar="FILE", default=None, help="the worker credential (mode 0600)")
    group.add_argument(
        "--label",
        type=_label,
        action="append",
        metavar="KEY=VALUE",
        help="a label tasks can require (repeatable)",
    )
    group.add_argument(
        "--slots", type=_slots, default=4, metavar="N", help="concurrent runs (1-1024, default 4)"
    )
    group.add_argument(
        "--home",
        metavar="DIR",
        default=None,
        help="journal, logs and receipts (default $QL3_HOME/remote-worker)",
    )
    group.add_argument(
        "--ca", metavar="FILE", default=None, help="CA bundle that signs the server's certificate"
    )
    group.add_argument(
        "--run-as",
        metavar="USER",
        default=None,
        help="run every task's command as USER (not root, not this worker's user; needs root and"
        " setpriv): a task then cannot read the token file or --home, nor signal the worker",
    )
    group.add_argument(
        "--project-run-as",
        type=_project_user,
        action="append",
        metavar="PROJECT_ID=USER",
        help="run the commands of the project with this id (ql3 project list --json) as USER instead of"
        " the --run-as user (repeatable; the same rules as --run-as)",
    )
    group.add_argument(
        "--allow-server-user",
        action="store_true",
        help="let --run-as or --project-run-as name this worker's own user (its tasks can then read the"
        " worker credential; said at start-up)",
    )
    group.add_argument(
        "--print-systemd-unit",
        action="store_true",
        help="print a systemd unit that runs this worker with these options, and exit (writes nothing)",
    )
    tokens: Parser = actions.add_parser("token", help="worker credentials", description="Worker credentials.")
    token_actions = tokens.add_subparsers(dest="token_action", metavar="ACTION", required=True)
    create = add_command(
        token_actions, "create", cmd_token_create, "a credential bound to one worker id (owner/admin)"
    )
    create.add_argument("worker", metavar="WORKER_ID", help="the worker id it may act for")
    create.add_argument(
        "--expires-in", type=int, metavar="SECONDS", default=None, help="lifetime (60 s - 10 years)"
    )
    create.add_argument(
        "--label",
        type=_label,
        action="append",
        metavar="KEY=VALUE",
        help="approve exactly these labels for the worker (repeatable; replaces those approved before);"
        " without it the worker's first registration binds its labels",
    )
    approve = add_command(
        actions,
        "approve",
        cmd_approve,
        "approve the labels a worker registers with (owner/admin): its pending request, or --label",
    )
    approve.add_argument("worker", metavar="WORKER_ID", help="the worker id")
    approve.add_argument(
        "--label",
        type=_label,
        action="append",
        metavar="KEY=VALUE",
        help="approve exactly these labels (repeatable) instead of the worker's pending request",
    )
    approve.add_argument(
        "--no-labels",
        action="store_true",
        help="approve an empty label set (the worker then registers without labels)",
    )
    lst = add_command(token_actions, "list", cmd_token_list, "list worker credentials (revoked ones too)")
    quiet_flag(lst)
    lst.add_argument("--after", metavar="ID", default=None, help="the next_after of the previous page")
    revoke = add_command(token_actions, "revoke", cmd_token_revoke, "revoke a worker credential")
    revoke.add_argument("id", metavar="ID", help="the credential id (ql3 worker token list)")
