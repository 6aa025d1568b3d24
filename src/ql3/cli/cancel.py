"""``ql3 run cancel | status | blocked | inspect | rearm``: cancellation and its management surface.

These are added to the ``run`` group that ``ql3.cli.runs`` builds.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from ql3.cli import human, output, watch
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    duration_s,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
    wants_utc,
)
from ql3.cli.errors import EXIT_ERROR, EXIT_OK, CliError, UsageError
from ql3.domain import cancellation as rules
from ql3.domain.errors import ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.states import RUN_TERMINAL

STATUS_SCHEMA: Final = "qinglong/run-cancellation-status@v1"
EXIT_CONVERGING: Final = 10
EXIT_ATTENTION: Final = 20
STATUS_EXIT: Final[dict[str, int]] = {
    "clear": EXIT_OK,
    "converging": EXIT_CONVERGING,
    "attention_required": EXIT_ATTENTION,
}
# ``run cancel --wait``: the run ended with another outcome before the cancellation took effect.
EXIT_NOT_CANCELLED: Final = 2
CANCELLED_OUTCOMES: Final = frozenset({"cancelled", "timed_out"})

STATUS_HELP: Final = """\
exit status:
  0    clear: no cancellation in flight or blocked
  10   converging: cancellations are pending, leased or waiting to retry
  20   attention_required: a cancellation is blocked (see ql3 run blocked / inspect / rearm)
  1    error (network, API, configuration), 64 usage
"""
CANCEL_HELP: Final = """\
exit status:
  0    the cancel was recorded; with --wait: the run ended cancelled or timed_out, or was already
       terminal when asked
  2    --wait: the run ended with another outcome (succeeded, failed, lost) before the stop took effect
  5    --wait: --timeout-wait elapsed first (the cancellation goes on)
  20   --wait: the cancellation is blocked (the process's identity could not be proven): see
       ql3 run inspect RUN and ql3 run rearm
  1    error, 64 usage
"""


def _run_path(args: argparse.Namespace) -> str:
    return watch.run_path(args.project, args.run)


def _project_path(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}"


# -- cancel ---------------------------------------------------------------------------------------


def _wait_cancelled(api: ApiClient, args: argparse.Namespace, poller: watch.Poller) -> dict[str, Any]:
    """Poll the cancellation view until the run is terminal and no stop is still in flight (a leased
    dispatch means the controller is still between TERM and KILL: stray members of the process group
    may be alive); stop early when it is blocked."""
    path = f"{_run_path(args)}/cancellation"
    while True:
        view = poller.call(api, "GET", path)
        dispatch = view.get("dispatch") or {}
        if view.get("runStatus") in RUN_TERMINAL and dispatch.get("status") != "leased":
            run: dict[str, Any] = poller.call(api, "GET", _run_path(args))
            return run
        if view.get("operatorAction") == "rearm":
            raise CliError(
                "cancellation_blocked",
                f"the cancellation of run {args.run} is blocked; see: ql3 run inspect {args.run}",
                EXIT_ATTENTION,
            )
        poller.wait()


def cmd_cancel(args: argparse.Namespace) -> int:
    timeout_s = args.timeout_wait
    if timeout_s is not None and (timeout_s != timeout_s or not 0 < timeout_s <= 10**9):
        raise UsageError("--timeout-wait must be a positive number of seconds")
    if timeout_s is not None and not args.wait:
        raise UsageError("--timeout-wait needs --wait")
    with ApiClient.from_environment() as api:
        _, answer = api.call("POST", f"{_run_path(args)}/cancel")
        result, run = str(answer["result"]), answer["run"]
        if print_quiet_id(args, run["id"]) and not args.wait:
            return EXIT_OK
        if args.wait and result != "already_terminal":
            if not wants_json(args) and not wants_quiet(args):
                output.note(f"run {run['id']} cancel {result}; waiting for it to stop")
            run = _wait_cancelled(api, args, watch.Poller(timeout_s=timeout_s))
    if wants_json(args):
        output.emit_json({"result": result, "run": run})
    elif not wants_quiet(args):
        output.line(f"run {run['id']} cancel {result}: {run['status']}")
    if not args.wait or result == "already_terminal" or run["status"] in CANCELLED_OUTCOMES:
        return EXIT_OK
    return EXIT_NOT_CANCELLED


# -- status -----------------------------------------------------------------------------------------


def status_projection(summary: dict[str, Any]) -> dict[str, Any]:
    """The one projection both the card and ``--json`` print."""
    return {"schema": STATUS_SCHEMA, **summary}


def _flatten(value: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            out += _flatten(item, f"{name}.")
        else:
            out.append((name, item))
    return out


def status_card(projection: dict[str, Any], utc: bool = False) -> list[tuple[str, Any]]:
    """The card: every field of the projection, dotted, in the projection's order (no ANSI); an
    instant (``...AtMs``) is shown as a labelled time under the name without ``Ms``."""
    return [_humane(key, value, utc) for key, value in _flatten(projection)]


def _humane(key: str, value: Any, utc: bool) -> tuple[str, Any]:
    if key.endswith("AtMs") and (value is None or isinstance(value, int)):
        return key.removesuffix("Ms"), human.when(value, utc)
    return key, value


def cmd_status(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:  # one request: no retry, polling or cache
        _, summary = api.call("GET", f"{_project_path(args)}/cancellation/summary")
    projection = status_projection(summary)
    exit_code = STATUS_EXIT.get(str(projection.get("assessment")))
    if exit_code is None:
        raise CliError("protocol_error", "the server answered an unknown assessment", EXIT_ERROR)
    if wants_json(args):
        output.emit_json(projection)
    else:
        output.fields(status_card(projection, wants_utc(args)), status_key="assessment")
    return exit_code


# -- blocked ----------------------------------------------------------------------------------------


def cmd_blocked(args: argparse.Namespace) -> int:
    if args.cursor is not None:
        try:  # checked before any network I/O
            rules.decode_blocked_cursor(args.cursor)
        except ValidationFailed:
            raise UsageError("--cursor is not a cursor this command printed", code="invalid_cursor") from None
    with ApiClient.from_environment() as api:
        _, page = api.call(
            "GET", f"{_project_path(args)}/cancellation/blocked", params={"cursor": args.cursor}
        )
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    if wants_quiet(args):
        output.ids_only(str(item["runId"]) for item in page["items"])
        if page.get("truncated") and page.get("nextCursor"):
            output.note(f"next cursor: {page['nextCursor']}")
        return EXIT_OK
    output.table(
        ("RUN", "BLOCKED"),
        [(item["runId"], human.when(item["blockedAtMs"], wants_utc(args))) for item in page["items"]],
    )
    if page.get("truncated") and page.get("nextCursor"):
        output.line(f"next cursor: {page['nextCursor']}")
    return EXIT_OK


# -- inspect / rearm ----------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, view = api.call("GET", f"{_run_path(args)}/cancellation")
    if wants_json(args):
        output.emit_json(view)
        return EXIT_OK
    dispatch = view.get("dispatch") or {}
    utc = wants_utc(args)
    output.fields(
        [_humane(k, v, utc) for k, v in view.items() if k != "dispatch"]
        + [_humane(f"dispatch.{k}", v, utc) for k, v in dispatch.items()]
        + ([] if dispatch else [("dispatch", None)]),
        status_key="runStatus",
    )
    if view.get("operatorAction") == "rearm":
        output.note(
            f"blocked: ql3 run rearm {args.run} --version {dispatch.get('version')} "
            f"--result {dispatch.get('lastResult')} --delay 60"
        )
    return EXIT_OK


def cmd_rearm(args: argparse.Namespace) -> int:
    delay = args.delay
    min_s, max_s = rules.MIN_REARM_DELAY_MS / 1000, rules.MAX_REARM_DELAY_MS / 1000
    if delay != delay or not min_s <= delay <= max_s:
        raise UsageError(f"--delay must be {min_s:g} to {max_s:g} seconds")
    if args.version < 1:
        raise UsageError("--version must be at least 1")
    mutation_id = args.mutation_id or f"cli.{new_id()}"
    try:
        rules.validate_mutation_id(mutation_id)
    except ValidationFailed:
        raise UsageError("--mutation-id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}") from None
    body = {
        "mutation_id": mutation_id,
        "expected_dispatch_version": args.version,
        "expected_last_result": args.result,
        "retry_delay_ms": round(delay * 1000),
    }
    with ApiClient.from_environment() as api:
        _, receipt = api.call("POST", f"{_run_path(args)}/cancellation/rearm", json=body)
    if wants_json(args):
        output.emit_json(receipt)
    else:
        output.fields([("mutation_id", mutation_id), *receipt.items()])
    return EXIT_OK


# -- registration -----------------------------------------------------------------------------------


def _run_actions(subparsers: Subparsers) -> Any:
    """The ``run`` group's subcommand table, built by ``ql3.cli.runs.register``."""
    group = subparsers.choices["run"]
    for action in group._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the run group has no subcommands")


def register(subparsers: Subparsers) -> None:
    actions = _run_actions(subparsers)
    proj = project_flag()
    raw = argparse.RawDescriptionHelpFormatter

    cancel: Parser = add_command(
        actions, "cancel", cmd_cancel, "cancel a run", proj, epilog=CANCEL_HELP, formatter_class=raw
    )
    cancel.add_argument("run", metavar="RUN", help="run id or a unique prefix of one")
    quiet_flag(cancel)
    cancel.set_defaults(refs={"run": "run"})
    cancel.add_argument(
        "--wait", action="store_true", help="wait until the run has stopped (see the exit status below)"
    )
    cancel.add_argument(
        "--timeout-wait",
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="with --wait: give up after DURATION (30, 2m)",
    )

    add_command(
        actions,
        "status",
        cmd_status,
        "the project's cancellation health card (one request)",
        proj,
        epilog=STATUS_HELP,
        formatter_class=raw,
    )

    blocked = add_command(
        actions, "blocked", cmd_blocked, "one page of 16 blocked cancellations, oldest first", proj
    )
    blocked.add_argument("--cursor", metavar="C", help="the next cursor printed by the previous page")
    quiet_flag(blocked)

    inspect = add_command(actions, "inspect", cmd_inspect, "a run's cancellation state", proj)
    inspect.add_argument("run", metavar="RUN", help="run id or a unique prefix of one")
    inspect.set_defaults(refs={"run": "run"})

    rearm = add_command(
        actions, "rearm", cmd_rearm, "retry a blocked cancellation after a delay (exact version)", proj
    )
    rearm.add_argument("run", metavar="RUN", help="run id or a unique prefix of one")
    rearm.set_defaults(refs={"run": "run"})
    rearm.add_argument(
        "--version", type=int, required=True, metavar="V", help="dispatch.version from inspect"
    )
    rearm.add_argument(
        "--result",
        required=True,
        choices=sorted(rules.BLOCKING_RESULTS),
        metavar="R",
        help="dispatch.lastResult from inspect: " + ", ".join(sorted(rules.BLOCKING_RESULTS)),
    )
    rearm.add_argument(
        "--delay",
        type=duration_s,
        required=True,
        metavar="DURATION",
        help="time until the retry (1s-1d: 30, 5m, 1h)",
    )
    rearm.add_argument("--mutation-id", default=None, metavar="ID", help="repeat one to replay its receipt")
