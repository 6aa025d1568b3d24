"""``ql3 init`` and ``ql3 serve``: prepare the database and the owner's credentials, then serve."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import stat
import sys
import textwrap
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Final, TextIO

from ql3.application import auth
from ql3.application.settings import ENV_VARS, PROFILES, ServeSettings, SettingsError, load_serve_settings
from ql3.bootstrap import (
    ManagedDatabase,
    TaskUser,
    TaskUsers,
    build_standalone_runtime,
    egress_policy,
    expected_schema_version,
    git_fetcher,
    open_database,
    resolve_task_user,
    variables_box,
)
from ql3.cli import logformat, output
from ql3.cli.common import Parser, Subparsers, add_command, wants_json
from ql3.cli.config import (
    DEFAULT_LISTEN,
    Credentials,
    client_url,
    credentials_path,
    database_url,
    parse_listen,
    read_credentials_file,
    write_credentials_file,
)
from ql3.cli.db import database_flag
from ql3.cli.disk import require_free_space, starting, state_dirs
from ql3.cli.errors import EXIT_DISK_FULL, EXIT_ERROR, EXIT_OK, CliError, UsageError
from ql3.cli.lock import EXIT_ALREADY_SERVING, LOCK_FILE, home_lock
from ql3.cli.private import private_umask, require_private_home, tighten_sqlite_files
from ql3.cli.units import Unit, current_user, ql3_program
from ql3.domain.errors import ConfigurationError, ValidationFailed
from ql3.domain.workers import parse_capabilities, validate_worker_id

log = logging.getLogger("ql3.serve")
DEFAULT_URL = client_url(*parse_listen(DEFAULT_LISTEN))

SCRIPTS_DIR: Final = "scripts"
DEFAULT_SCRIPTS_MODE: Final = 0o700
# ``ql3 serve`` exit statuses besides 0/1/64 (sysexits.h): nothing is written in either case.
EXIT_ADDRESS_IN_USE: Final = 69  # EX_UNAVAILABLE: --listen cannot be bound
SERVE_EPILOG: Final = f"""\
exit status:
  0    stopped by SIGINT/SIGTERM after a clean shutdown
  1    error (database, start-up)
  64   usage: bad arguments or settings
  {EXIT_ADDRESS_IN_USE}   the --listen address is in use: nothing was written; pick another --listen
  {EXIT_DISK_FULL}   a disk it writes to (QL3_HOME, a SQLite database's directory) has less than 1 MiB free:
       one line names the directory; free space there and start again
  {EXIT_ALREADY_SERVING}   another ql3 serve already runs on this QL3_HOME ($QL3_HOME/{LOCK_FILE})

tasks without --cwd run in the scripts directory: $QL3_HOME/{SCRIPTS_DIR} unless --scripts-dir
(created at start, mode --scripts-mode, default 0700).
keep it running: ql3 serve --print-systemd-unit > ~/.config/systemd/user/ql3.service
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    db: ManagedDatabase
    credentials: Path
    owner_created: bool
    credentials_written: bool


def prepare(db_url: str, api_url: str, *, update_url: bool, home: Path | None = None) -> Prepared:
    """Migrate, create the owner on the very first start, and keep the credentials file in step.

    The owner's token exists only in the transaction that creates it, so it is written to the
    credentials file right then; later starts can only update the file's ``url``.

    The state is private first: umask 077, a refused group- or world-accessible ``QL3_HOME``, and
    0600 on SQLite files left by an older ql3 (docs/security.md).
    """
    private_umask()
    require_private_home(credentials_path().parent)
    tighten_sqlite_files(db_url)
    db = open_database(db_url)
    try:
        db.migrate()
        issued = db.transaction(auth.bootstrap_owner)
        path = credentials_path(home)
        written = False
        if issued is not None:
            write_credentials_file(path, Credentials(url=api_url, token=issued.token))
            written = True
        elif update_url:
            stored = read_credentials_file(path)
            if stored is not None and stored.url != api_url:
                write_credentials_file(path, Credentials(url=api_url, token=stored.token))
                written = True
    except BaseException:
        db.close()
        raise
    return Prepared(db=db, credentials=path, owner_created=issued is not None, credentials_written=written)


def cmd_init(args: argparse.Namespace) -> int:
    prepared = prepare(
        database_url(args.database_url), args.url or DEFAULT_URL, update_url=args.url is not None
    )
    prepared.db.close()
    has_credentials = prepared.credentials.exists()
    if wants_json(args):
        output.emit_json(
            {
                "owner_created": prepared.owner_created,
                "credentials": str(prepared.credentials),
                "credentials_present": has_credentials,
            }
        )
    elif prepared.owner_created:
        output.line(f"initialised; owner credentials written to {prepared.credentials}")
    else:
        output.line("already initialised")
    if not has_credentials:
        raise CliError(
            "credentials_missing",
            f"the owner exists but {prepared.credentials} is missing; ask an admin for a token",
        )
    return EXIT_OK


def _ignore(signum: int, frame: FrameType | None) -> None:
    """uvicorn re-raises the signal that stopped it once it has shut down; by then we are done."""


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The one validated settings object of this server, from its flags and ``QL3_*`` variables; a bad
    value is a usage error (exit 64) naming the variable, raised before anything is opened."""
    try:
        return load_serve_settings(
            os.environ,
            profile=args.profile,
            slots=args.slots,
            worker_id=args.worker_id,
            database_url=args.database_url,
            cpus=os.cpu_count() or 1,
            labels=_labels(getattr(args, "label", None)),
            notify_allow=getattr(args, "notify_allow", None) or (),
        )
    except SettingsError as exc:
        raise UsageError(exc.message, code=exc.code) from None


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind the API's socket before anything is written, so a taken port changes nothing."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--listen host {host!r} does not resolve") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart at once
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            reason = {errno.EADDRINUSE: "address already in use", errno.EACCES: "permission denied"}.get(
                exc.errno, "not an address of this machine"
            )
            raise CliError(
                "address_in_use" if exc.errno == errno.EADDRINUSE else "cannot_listen",
                f"cannot listen on {host}:{port}: {reason}; nothing was written. "
                "Choose another with --listen HOST:PORT",
                EXIT_ADDRESS_IN_USE,
            ) from None
        raise
    return sock


def scripts_dir(args: argparse.Namespace, base: Path) -> Path:
    """The default working directory of tasks, created with ``--scripts-mode`` (it is tightened or
    loosened to that mode at every start, so the setting is what is on disk)."""
    path = Path(args.scripts_dir) if args.scripts_dir else base / SCRIPTS_DIR
    if not path.is_absolute():
        raise UsageError("--scripts-dir must be an absolute path")
    path.mkdir(parents=True, exist_ok=True, mode=args.scripts_mode)
    if stat.S_IMODE(path.stat().st_mode) != args.scripts_mode:
        path.chmod(args.scripts_mode)
    return path


def first_start_message(url: str, credentials: Path, out: TextIO) -> None:
    """What a newcomer needs after the very first start: where the console is and how to sign in."""
    out.write(
        "ql3: first start: the owner was created; its token is in "
        f"{credentials} (mode 0600, shown nowhere else)\n"
        f'  console: open {url}/ and paste the token (e.g. python3 -c "import json; '
        f"print(json.load(open('{credentials}'))['token'])\")\n"
        "  CLI:     ql3 task list        (reads the credentials file; ql3 token create --role ... for "
        "other people)\n"
        "  service: ql3 serve --print-systemd-unit\n"
    )


def systemd_unit(args: argparse.Namespace, base: Path) -> str:
    """A systemd unit that runs this very ``ql3 serve`` (same binary, home, listen and database)."""
    serve = [*ql3_program(), "serve", "--listen", args.listen, "--profile", args.profile]
    if args.scripts_dir:
        serve += ["--scripts-dir", args.scripts_dir]
    if args.scripts_mode != DEFAULT_SCRIPTS_MODE:
        serve += ["--scripts-mode", f"{args.scripts_mode:o}"]
    if args.slots is not None:
        serve += ["--slots", str(args.slots)]
    if args.worker_id is not None:
        serve += ["--worker-id", args.worker_id]
    if args.run_as is not None:
        serve += ["--run-as", args.run_as]
    for project, task_user in args.project_run_as or []:
        serve += ["--project-run-as", f"{project}={task_user}"]
    for allowed in args.notify_allow or []:
        serve += ["--notify-allow", allowed]
    if not args.access_log:
        serve += ["--no-access-log"]
    if args.allow_server_user:
        serve += ["--allow-server-user"]
    if args.database_url:
        serve += ["--database-url", args.database_url]
    return Unit(
        name="ql3",
        description="ql3 task-execution server",
        command=serve,
        user=current_user(),
        environment=[f"QL3_HOME={base}"],
        stop_notes=[
            "Running tasks outlive a restart of the server and are adopted again when it is back:",
            "stop only the server's own process, never the tasks' process groups.",
        ],
        no_restart={64: "bad settings", EXIT_ALREADY_SERVING: "another server holds QL3_HOME"},
    ).render()


def cmd_serve(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    settings = serve_settings(args)  # every flag and QL3_* variable, validated before anything is opened
    if args.print_systemd_unit:
        sys.stdout.write(systemd_unit(args, settings.home.resolve()))
        return EXIT_OK
    private_umask()
    require_private_home(settings.home)  # before the lock file: an open home is refused untouched
    disks = state_dirs(settings.home, settings.database_url)
    require_free_space(disks)  # exit 74 with one line, before anything is written
    with home_lock(settings.home):
        listener = bind_listener(host, port)
        try:
            return starting(disks, lambda: _serve(args, settings, host, port, listener))
        finally:
            listener.close()


def _serve(
    args: argparse.Namespace, settings: ServeSettings, host: str, port: int, listener: socket.socket
) -> int:
    # Imported here so that every other command starts without the web stack.
    import uvicorn

    from ql3.http.app import create_app
    from ql3.http.limits import read_deadline_protocol

    logformat.configure(sys.stderr)
    # The server's threads mostly wait on I/O (spawn, fsync, SQLite); a short GIL switch interval lets
    # a thread whose I/O finished run again promptly instead of after CPython's default 5 ms.
    sys.setswitchinterval(0.0005)
    task_user = _task_user(args.run_as, allow_server_user=args.allow_server_user)
    project_users = _project_users(args.project_run_as or [], allow_server_user=args.allow_server_user)
    prepared = prepare(settings.database_url, client_url(host, port), update_url=True, home=settings.home)
    workdir = scripts_dir(args, settings.home)  # after prepare(): an open QL3_HOME is refused untouched
    try:
        task_users = _task_users(prepared.db, task_user, project_users)
        egress = egress_policy(settings, host)
        runtime = build_standalone_runtime(
            prepared.db,
            settings,
            run_as=task_user,
            task_users=task_users,
            default_cwd=workdir,
            egress=egress,
            notify_url=client_url(host, port),
        )
        logs_root = Path(runtime.worker.config.logs_dir)  # $QL3_HOME/worker/logs
        app = create_app(
            prepared.db,
            lifecycle=[runtime],
            logs_root=logs_root,
            schema_version=expected_schema_version(prepared.db.dialect),
            egress=egress,
            secret_box=variables_box(settings.home),
            git=git_fetcher(),
            session_policy=settings.sessions,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_level="info",
            access_log=args.access_log,
            server_header=False,
            proxy_headers=False,
            # slow clients: headers within 10 s, the body within 30 s more, idle keep-alive 5 s
            http=read_deadline_protocol(),
            timeout_keep_alive=5,
            timeout_graceful_shutdown=10,
            # edge boxes get a smaller connection budget; behaviour is the same
            limit_concurrency=settings.budgets.http_concurrency,
            backlog=settings.budgets.http_backlog,
        )
        server = uvicorn.Server(config)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _ignore)
        output.note(
            f"ql3 {settings.profile} serving on {client_url(host, port)}; credentials: {prepared.credentials}"
        )
        if prepared.owner_created:
            first_start_message(client_url(host, port), prepared.credentials, sys.stderr)
        try:
            server.run(sockets=[listener])
        except SystemExit as exc:  # uvicorn exits on bind or lifespan startup failure
            code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
            return code or EXIT_ERROR
        return EXIT_OK if server.started else EXIT_ERROR
    finally:
        prepared.db.close()


def _task_user(name: str | None, *, allow_server_user: bool, who: str = "server") -> TaskUser | None:
    """Resolve ``--run-as``; without it, warn that tasks can read everything this server (or remote
    worker, ``who``) can."""
    user = None
    if name is not None:
        try:
            user = resolve_task_user(name, allow_server_user=allow_server_user)
        except ConfigurationError as exc:
            raise UsageError(exc.message, code="bad_run_as") from None
    if user is None and who == "worker":
        output.note(
            f"warning: tasks run as this worker's own user (uid {os.geteuid()}): any task can read the"
            " worker credential (--token-file) and --home (journal, receipts, other runs' logs) and pull"
            " other projects' runs with it; start as root with --run-as USER to run them as another user"
            " (docs/security.md)"
        )
    elif user is None:
        output.note(
            f"warning: tasks run as this server's own user (uid {os.geteuid()}): whoever may add tasks and"
            " start runs in any project can read $QL3_HOME (the owner's credentials, every project's"
            " secrets); start as root with --run-as USER to run them as another user (docs/security.md)"
        )
    return user


def _project_users(
    pairs: list[tuple[str, str]], *, allow_server_user: bool
) -> list[tuple[str, TaskUser | None]]:
    """Resolve each ``--project-run-as PROJECT=USER``'s user (before anything is opened)."""
    resolved: list[tuple[str, TaskUser | None]] = []
    for project, name in pairs:
        try:
            user = resolve_task_user(name, flag="--project-run-as", allow_server_user=allow_server_user)
        except ConfigurationError as exc:
            raise UsageError(f"{exc.message} ({project}={name})", code="bad_run_as") from None
        resolved.append((project, user))
    return resolved


def _task_users(
    db: ManagedDatabase, default: TaskUser | None, project_users: list[tuple[str, TaskUser | None]]
) -> TaskUsers | None:
    """Map each ``--project-run-as`` project (name or id) to its id; an unknown project is a usage error."""
    if not project_users:
        return None
    from ql3.domain.errors import NotFound

    by_id: dict[str, TaskUser | None] = {}
    for ref, user in project_users:
        try:
            project = db.transaction(partial(auth.resolve_project, ref=ref), write=False)
        except NotFound:
            raise UsageError(f"--project-run-as: no such project {ref!r}", code="bad_run_as") from None
        if project.id in by_id:
            raise UsageError(f"--project-run-as: project {ref!r} given twice", code="bad_run_as")
        by_id[project.id] = user
        if user is None:
            output.note(
                f"warning: tasks of project {project.name} run as this server's own user"
                " (--allow-server-user): its operators can read $QL3_HOME (docs/security.md)"
            )
    return TaskUsers(default=default, projects=MappingProxyType(by_id))


def _slots(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError("must be 1-1024")
    return value


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    try:
        parse_capabilities({"executors": ["local_process"], "labels": {key: value}})
    except ValidationFailed:
        raise argparse.ArgumentTypeError("KEY=VALUE without control characters") from None
    if not sep:
        raise argparse.ArgumentTypeError("KEY=VALUE")
    return key, value


def _labels(pairs: list[tuple[str, str]] | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for key, value in pairs or []:
        if labels.get(key, value) != value:
            raise UsageError(f"--label {key} given twice with different values")
        labels[key] = value
    return labels


def _worker_id(text: str) -> str:
    try:
        return validate_worker_id(text)
    except ValidationFailed:
        raise argparse.ArgumentTypeError("letters, digits and . _ : - (at most 128)") from None


def _serve_epilog() -> str:
    lines = ["profiles (budgets per cycle; an idle loop sleeps up to its backstop unless woken):"]
    for budgets in PROFILES.values():
        lines.append(f"  {budgets.name}")
        for item in budgets.describe():
            lines += textwrap.wrap(item, 100, initial_indent="    ", subsequent_indent="      ")
    lines.append("environment (invalid values exit 64 before anything is opened; docs/configuration.md):")
    for var in ENV_VARS:
        text = f"{var.name}  {var.low}-{var.high}, default {var.default}: {var.help}"
        lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def register(subparsers: Subparsers) -> None:
    init = add_command(
        subparsers,
        "init",
        cmd_init,
        "migrate the database, create the owner and write $QL3_HOME/credentials (0600)",
    )
    database_flag(init)
    init.add_argument(
        "--url", metavar="URL", help=f"API URL to record in the credentials (default {DEFAULT_URL})"
    )

    serve = add_command(
        subparsers,
        "serve",
        cmd_serve,
        "run the standalone server (first start: migrate, create the owner, write credentials)",
        epilog=SERVE_EPILOG + "\n" + _serve_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    service_flags(serve)
    serve.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default="standalone",
        help="standalone (default), or edge: slower idle backstops and smaller budgets for small boxes"
        " (the budgets are listed below)",
    )
    serve.add_argument(
        "--slots",
        type=_slots,
        metavar="N",
        default=None,
        help="concurrent runs of the embedded worker (1-1024, edge 1-16; default: see the profiles)",
    )
    serve.add_argument(
        "--worker-id",
        type=_worker_id,
        metavar="ID",
        default=None,
        help="id of the embedded worker (default embedded-<hostname>); give each server sharing one"
        " PostgreSQL database its own",
    )
    serve.add_argument(
        "--label",
        type=_label,
        action="append",
        metavar="KEY=VALUE",
        help="a label of the embedded worker, matched by tasks' --require and --prefer (repeatable)",
    )
    serve.add_argument(
        "--run-as",
        metavar="USER",
        default=None,
        help="run every task's command as USER (not root, not the server's user; needs root and"
        " setpriv): a task then cannot read $QL3_HOME. Without it tasks run as the server's user",
    )
    serve.add_argument(
        "--project-run-as",
        type=_project_user,
        action="append",
        metavar="PROJECT=USER",
        help="run the commands of PROJECT (name or id) as USER instead of the --run-as user"
        " (repeatable; the same rules as --run-as): one task user per project keeps each project's"
        " tasks out of the others' files",
    )
    serve.add_argument(
        "--allow-server-user",
        action="store_true",
        help="let --run-as or --project-run-as name the server's own user (its tasks can then read"
        " $QL3_HOME; said at start-up)",
    )
    serve.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"default {DEFAULT_LISTEN}"
    )
    notify_allow_flag(serve)
    access_log_flag(serve)
    database_flag(serve)


def notify_allow_flag(parser: Parser) -> None:
    parser.add_argument(
        "--notify-allow",
        action="append",
        metavar="CIDR|HOST",
        help="let webhook channels reach this network, address or host name (repeatable): by default"
        " loopback, link-local (cloud metadata), private ranges and this server's own addresses are"
        " refused (docs/notifications.md)",
    )


def access_log_flag(parser: Parser) -> None:
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log one line per HTTP request on stderr (default on; --no-access-log saves its cost on a"
        " busy API: warnings and errors are logged either way)",
    )


def _project_user(text: str) -> tuple[str, str]:
    project, sep, user = text.partition("=")
    if not sep or not project or not user:
        raise argparse.ArgumentTypeError("PROJECT=USER")
    return project, user


def _mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError("an octal mode such as 0700, 0750 or 0755") from None
    if value & ~0o755 or (value & 0o700) != 0o700:
        raise argparse.ArgumentTypeError("0700, 0750, 0755 or similar: owner rwx, never group/other write")
    return value


def service_flags(serve: Parser) -> None:
    """Where tasks run by default, and the systemd unit."""
    serve.add_argument(
        "--scripts-dir",
        metavar="DIR",
        default=None,
        help=f"absolute default working directory of tasks (default $QL3_HOME/{SCRIPTS_DIR})",
    )
    serve.add_argument(
        "--scripts-mode",
        type=_mode,
        metavar="MODE",
        default=DEFAULT_SCRIPTS_MODE,
        help="mode of the scripts directory (default 0700; 0750 or 0755 when tasks run as another user)",
    )
    serve.add_argument(
        "--print-systemd-unit",
        action="store_true",
        help="print a systemd unit that runs this server with these options, and exit",
    )
