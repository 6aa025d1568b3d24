"""``ql3 control``: one control-plane replica of a cluster (docs/cluster.md), without an embedded worker.

Any number of replicas serve one PostgreSQL database. The first start on an empty database migrates
it (under an advisory lock), creates the owner and writes ``$QL3_HOME/credentials`` (0600) like
``ql3 serve``; later replicas find the owner and write nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Final

from ql3.application import auth
from ql3.application.settings import ENV_VARS, PROFILES, ServeSettings, SettingsError, load_serve_settings
from ql3.bootstrap import egress_policy, expected_schema_version, git_fetcher, open_database, variables_box
from ql3.cli import logformat, output
from ql3.cli.common import Subparsers, add_command
from ql3.cli.config import DEFAULT_LISTEN, Credentials, credentials_path, parse_listen, write_credentials_file
from ql3.cli.disk import require_free_space, starting, state_dirs
from ql3.cli.errors import EXIT_ERROR, EXIT_OK, UsageError
from ql3.cli.private import private_umask, require_private_home
from ql3.cli.server import _ignore, access_log_flag, bind_listener, first_start_message, notify_allow_flag
from ql3.cli.units import Unit, current_user, kept_environment, ql3_program
from ql3.domain.errors import ValidationFailed
from ql3.domain.workers import validate_worker_id

EPILOG: Final = """\
a failover-ready cluster (docs/cluster.md: the standby, timings, backups, upgrades):
  export QL3_DATABASE_URL='postgresql://ql3@db1,db2/ql3?target_session_attrs=read-write'
  ql3 control --listen 0.0.0.0:5700 --replica-id cp-a        # on cp-a; cp-b likewise
  ql3 worker token create w1 > w1.token     # owner or admin of default; the token is shown once
  ql3 worker --server http://cp-a:5700 --server http://cp-b:5700 --token-file w1.token --slots 4
  QL3_URL=http://cp-a:5700,http://cp-b:5700 ql3 task list   # the CLI on both replicas
keep it running: ql3 control ... --replica-id cp-a --print-systemd-unit (a unit for this very replica)

environment: the QL3_* variables of `ql3 serve --help`; QL3_LOG_CAP_BYTES is also the quota of each
  attempt's log shipped by remote workers (past it one truncation marker, the rest dropped)

exit status:
  0    stopped by SIGINT/SIGTERM after a clean shutdown
  1    error (database, start-up)
  64   usage: bad arguments or settings (e.g. a SQLite database: replicas need PostgreSQL)
  69   the --listen address cannot be bound (nothing was written)
  74   QL3_HOME is on a disk with less than 1 MiB free (one line names it; nothing was written)
"""


def _replica_id(text: str) -> str:
    try:
        return validate_worker_id(text)
    except ValidationFailed:
        raise argparse.ArgumentTypeError("letters, digits and . _ : - (at most 128)") from None


def cmd_control(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    try:
        settings = load_serve_settings(
            os.environ,
            profile=args.profile,
            slots=None,
            worker_id=None,
            database_url=args.database_url,
            cpus=os.cpu_count() or 1,
            notify_allow=args.notify_allow or (),
        )
    except SettingsError as exc:
        raise UsageError(exc.message, code=exc.code) from None
    if not settings.database_url.startswith(("postgresql://", "postgres://")):
        raise UsageError(
            "ql3 control needs --database-url postgresql://... (replicas share one PostgreSQL"
            " database); for one machine on SQLite use ql3 serve",
            code="control_needs_postgres",
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{path}: no such file")
    replica_id = args.replica_id or f"control-{socket.gethostname()}-{port}"[:128]
    if args.print_systemd_unit:
        sys.stdout.write(systemd_unit(args, settings, replica_id))
        return EXIT_OK
    private_umask()
    require_private_home(settings.home)
    disks = state_dirs(settings.home)  # its database is PostgreSQL's: only the credentials are here
    require_free_space(disks)
    listener = bind_listener(host, port)
    try:
        return starting(disks, lambda: _control(args, settings, replica_id, host, port, listener))
    finally:
        listener.close()


def systemd_unit(args: argparse.Namespace, settings: ServeSettings, replica_id: str) -> str:
    """A systemd unit that runs this very replica: the same binary, home, listen, replica id, database
    and QL3_* settings (a replica id is kept explicit: the default one changes with the host name)."""
    command = [*ql3_program(), "control", "--listen", args.listen, "--replica-id", replica_id]
    command += ["--profile", args.profile]
    if not args.access_log:
        command += ["--no-access-log"]
    if args.tls_cert is not None:
        command += ["--tls-cert", str(Path(args.tls_cert).absolute())]
        command += ["--tls-key", str(Path(args.tls_key).absolute())]
    environment = [f"QL3_HOME={settings.home.resolve()}"]
    if args.database_url:
        command += ["--database-url", args.database_url]
    else:
        environment.append(f"QL3_DATABASE_URL={settings.database_url}")
    environment += kept_environment(os.environ, [var.name for var in ENV_VARS])
    return Unit(
        name=f"ql3-control-{replica_id}",
        description=f"ql3 control-plane replica {replica_id}",
        command=command,
        user=current_user(),
        environment=environment,
        stop_notes=[
            "A unit file is readable by every user: keep a database password in ~/.pgpass of the",
            "User= (mode 0600), not in the URL. SIGTERM answers the long-polls in flight at once",
            "(workers move to another replica) and shuts down gracefully within 10 s.",
        ],
        no_restart={64: "bad settings or a SQLite database"},
    ).render()


def _url(host: str, port: int, tls: bool) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def _control(
    args: argparse.Namespace,
    settings: ServeSettings,
    replica_id: str,
    host: str,
    port: int,
    listener: socket.socket,
) -> int:
    import uvicorn

    from ql3.cluster.runtime import build_control_runtime
    from ql3.http.app import create_app
    from ql3.http.limits import read_deadline_protocol

    logformat.configure(sys.stderr)
    sys.setswitchinterval(0.0005)
    db = open_database(settings.database_url)
    try:
        db.migrate()  # under PostgreSQL's advisory lock: concurrent first starts serialise
        issued = db.transaction(auth.bootstrap_cluster_owner)
        url = _url(host, port, args.tls_cert is not None)
        creds = credentials_path(settings.home)
        if issued is not None:
            write_credentials_file(creds, Credentials(url=url, token=issued.token))
        egress = egress_policy(settings, host)
        runtime = build_control_runtime(db, settings, replica_id=replica_id, egress=egress, console_url=url)
        app = create_app(
            db,
            lifecycle=[runtime],
            extensions=[runtime.api],
            schema_version=expected_schema_version(db.dialect),
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
            http=read_deadline_protocol(),
            timeout_keep_alive=5,
            timeout_graceful_shutdown=10,
            limit_concurrency=settings.budgets.http_concurrency,
            backlog=settings.budgets.http_backlog,
            ssl_certfile=args.tls_cert,
            ssl_keyfile=args.tls_key,
        )

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                # Long-polls in flight answer at once, so the graceful shutdown does not wait on them.
                for close in runtime.closers:
                    close()
                super().handle_exit(sig, frame)

        server = Server(config)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _ignore)
        output.note(f"ql3 control replica {replica_id} serving on {url}")
        if issued is not None:
            first_start_message(url, creds, sys.stderr)
        try:
            server.run(sockets=[listener])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
            return code or EXIT_ERROR
        return EXIT_OK if server.started else EXIT_ERROR
    finally:
        db.close()


def register(subparsers: Subparsers) -> None:
    control = add_command(
        subparsers,
        "control",
        cmd_control,
        "run one control-plane replica of a cluster on PostgreSQL (no embedded worker)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    control.add_argument(
        "--database-url",
        metavar="URL",
        help="postgresql://... shared by every replica (env QL3_DATABASE_URL)",
    )
    control.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"default {DEFAULT_LISTEN}"
    )
    access_log_flag(control)
    notify_allow_flag(control)
    control.add_argument(
        "--replica-id",
        type=_replica_id,
        metavar="ID",
        default=None,
        help="this replica's owner id in cancellation and approved-action leases"
        " (default control-<hostname>-<port>; give each replica its own)",
    )
    control.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default="standalone",
        help="budgets and idle backstops of the control loops (see ql3 serve --help)",
    )
    control.add_argument(
        "--tls-cert", metavar="FILE", default=None, help="serve HTTPS with this certificate (PEM)"
    )
    control.add_argument(
        "--tls-key", metavar="FILE", default=None, help="the certificate's private key (PEM)"
    )
    control.add_argument(
        "--print-systemd-unit",
        action="store_true",
        help="print a systemd unit that runs this replica with these options, and exit (writes nothing)",
    )
