"""``ql3``: the command line. ``main(argv) -> int``; ``entrypoint()`` exits with it."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Any, Final

import ql3
from ql3.cli import (
    actions,
    approvals,
    cancel,
    completion,
    control,
    db,
    deps,
    env,
    loops,
    notify,
    output,
    projects,
    refs,
    runs,
    scripts,
    server,
    subscriptions,
    tasks,
    tokens,
    users,
    whoami,
    workers,
)
from ql3.cli.common import Handler, Parser, wants_json
from ql3.cli.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError
from ql3.domain.errors import Ql3Error

EPILOG: Final = """\
environment:
  QL3_HOME           state directory: credentials, ql3.db (default ~/.ql3)
  QL3_URL            API URL; wins over $QL3_HOME/credentials (a cluster: URL,URL2... of replicas)
  QL3_TOKEN          bearer token; wins over $QL3_HOME/credentials
  QL3_DATABASE_URL   database of init, serve, control and db (default sqlite:///$QL3_HOME/ql3.db)
  NO_COLOR           set to anything: no status colours (they are shown only on a terminal)

output:
  times are local and labelled with the zone (--utc for UTC); ids in tables are short: any unique
  prefix of an id is accepted wherever an id is (ql3 run show 01a230ad-0ea7); -q prints only full
  ids, wherever a command prints one (lists, run start, task add...); --json prints the API's
  fields, and errors as {"error": {code, message}} on stderr

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
  serve:
  69   the --listen address cannot be bound (nothing was written)
  74   a disk it writes to is full (also ql3 control, ql3 worker): one line names the directory
  75   another ql3 serve already runs on this QL3_HOME (or db restore while it runs)
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
  ql3 control --database-url postgresql://... --replica-id cp-a   # a cluster replica (docs/cluster.md)
  ql3 worker token create w1 > w1.token; ql3 worker --server URL --token-file w1.token
  ql3 token create --role viewer --name dashboard
  ql3 env set JD_COOKIE - --secret < cookie.txt   # every task of the project gets it (docs/variables.md)
  ql3 token list; ql3 token revoke ID; ql3 whoami
  ql3 db status
  ql3 deps add python requests==2.32.*        # per-project dependencies (docs/dependencies.md)
  ql3 completion bash > ~/.local/share/bash-completion/completions/ql3
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
    parser.add_argument("--utc", action="store_true", default=False, help="show times in UTC, not local")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    server.register(commands)
    control.register(commands)
    tasks.register(commands)
    runs.register(commands)
    cancel.register(commands)  # adds cancel, status, blocked, inspect, rearm to the run group
    approvals.register(commands)
    actions.register(commands)
    workers.register(commands)
    loops.register(commands)
    tokens.register(commands)
    whoami.register(commands)
    projects.register(commands)
    scripts.register(commands)
    subscriptions.register(commands)
    db.register(commands)
    completion.register(commands)
    notify.register(commands)
    deps.register(commands)
    env.register(commands)
    users.register(commands)
    return parser


def _parse(parser: Parser, argv: list[str], as_json: bool) -> argparse.Namespace | int:
    """Parse ``argv``; ``--help``, ``--version`` and usage errors (64) end here with their exit code.

    Under ``--json`` a usage error is reported as a JSON error on stderr like every other error."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured) if as_json else contextlib.nullcontext():
            return parser.parse_args(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
        text = captured.getvalue()
        if code == EXIT_USAGE and as_json:
            message = text.strip().splitlines()[-1] if text.strip() else "bad arguments"
            output.emit_json_error("usage", message.partition("error: ")[2] or message)
        elif text:
            sys.stderr.write(text)
        return code


def _report(args: argparse.Namespace | None, code: str, message: str, details: Any = None) -> None:
    if args is not None and wants_json(args):
        output.emit_json_error(code, message, details)
    else:
        sys.stderr.write(f"error: {code}: {message}\n")


def _not_found(args: argparse.Namespace, exc: CliError) -> CliError:
    """Echo what was not found, with the closest task name or the command that lists what exists."""
    given: dict[str, str] = getattr(args, "given", None) or {}
    declared: dict[str, str] = getattr(args, "refs", None) or {}
    for attr, kind in declared.items():
        value = given.get(attr, getattr(args, attr, None))
        if not value or kind not in exc.message:
            continue
        hint = refs.suggest_task(str(args.project), str(value)) if kind == "task" else ""
        word = refs.KIND_WORDS[kind]
        return CliError(
            exc.code,
            f"{word} {value!r} not found{hint} (see: {refs.LIST_HINT[kind]})",
            exc.exit_code,
            details=exc.details,
        )
    return exc


def main(argv: list[str] | None = None) -> int:
    completion.autocomplete(build_parser)  # only acts when the shell asks for completions
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        parser.print_help()
        return EXIT_OK
    argv = notify.rewrite_argv(argv)
    parsed = _parse(parser, argv, "--json" in argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    handler: Handler = args.handler
    try:
        refs.resolve_args(args)
        return handler(args)
    except CliError as exc:
        if exc.code == "not_found":
            exc = _not_found(args, exc)
        _report(args, exc.code, exc.message, exc.details)
        return exc.exit_code
    except Ql3Error as exc:
        _report(args, exc.code, exc.message)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        _report(args, "os_error", exc.strerror or type(exc).__name__)
        return EXIT_ERROR
    except Exception as exc:  # the message may carry data; show only the type
        _report(args, "internal_error", type(exc).__name__)
        return EXIT_ERROR


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
