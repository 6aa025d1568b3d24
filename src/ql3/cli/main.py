"""``ql3``: the command line. ``main(argv) -> int``; ``entrypoint()`` exits with it."""

from __future__ import annotations

import argparse
import sys
from typing import Final

import ql3
from ql3.cli import actions, approvals, cancel, db, notify, projects, runs, server, tasks, tokens, workers
from ql3.cli.common import Handler, Parser
from ql3.cli.errors import EXIT_ERROR, CliError
from ql3.domain.errors import Ql3Error

EPILOG: Final = """\
environment:
  QL3_HOME           state directory: credentials, ql3.db (default ~/.ql3)
  QL3_URL            API URL; wins over $QL3_HOME/credentials
  QL3_TOKEN          bearer token; wins over $QL3_HOME/credentials
  QL3_DATABASE_URL   database of init, serve and db (default sqlite:///$QL3_HOME/ql3.db)

exit codes:
  0    success
  1    error: the API refused the request (401, 403, 404, 409...), network, database
  64   usage: bad arguments, or input the API rejected as invalid (422, 413)
  run start --wait / --follow exit with the run's outcome:
  0    succeeded
  2    failed (non-zero exit, start failure, or lost and not retried)
  3    timed_out
  4    cancelled
  5    --timeout-wait elapsed before the run ended
  run start of an approval-required task prints the approval id and exits 0, also with
  --wait: its run exists only once another user has approved it (ql3 approval approve ID)
  run cancel --wait:
  0    the run ended cancelled or timed_out, or was already terminal
  2    it ended otherwise (succeeded, failed, lost) before the stop took effect
  5    --timeout-wait elapsed first
  20   the cancellation is blocked (ql3 run inspect RUN, ql3 run rearm)
  run status (the cancellation health card):
  0    clear
  10   converging: cancellations in flight
  20   attention_required: a cancellation is blocked (ql3 run blocked, inspect, rearm)

examples:
  ql3 serve                                     # first start creates the owner's credentials
  ql3 task add backup --command 'tar czf /tmp/b.tgz /srv' --cron '0 3 * * *'
  ql3 run start backup --idempotency-key nightly-1
  ql3 run start backup --follow                 # stream the log, exit with the outcome
  ql3 run logs RUN --follow
  ql3 run cancel RUN --wait                     # stop the whole process group, wait for it
  ql3 run status --json                         # exit 0 clear, 10 converging, 20 attention
  ql3 approval approve ID --reason change_window
  ql3 run list --task backup --json
  ql3 worker list
  ql3 token create --role viewer --name dashboard
  ql3 db status
"""


def build_parser() -> Parser:
    parser = Parser(
        prog="ql3",
        description="ql3: a durable task-execution control plane.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ql3 {ql3.__version__}")
    parser.add_argument("--json", action="store_true", default=False, help="machine-readable output")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    server.register(commands)
    tasks.register(commands)
    runs.register(commands)
    cancel.register(commands)  # adds cancel, status, blocked, inspect, rearm to the run group
    approvals.register(commands)
    actions.register(commands)
    workers.register(commands)
    tokens.register(commands)
    projects.register(commands)
    db.register(commands)
    notify.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors (64) leave through argparse
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    handler: Handler = args.handler
    try:
        return handler(args)
    except CliError as exc:
        sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
        return exc.exit_code
    except Ql3Error as exc:
        sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        sys.stderr.write(f"error: os_error: {exc.strerror or type(exc).__name__}\n")
        return EXIT_ERROR
    except Exception as exc:  # the message may carry data; show only the type
        sys.stderr.write(f"error: internal_error: {type(exc).__name__}\n")
        return EXIT_ERROR


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
