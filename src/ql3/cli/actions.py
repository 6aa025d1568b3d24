"""``ql3 action list | show | resolve``: approved actions and the manual recovery of one whose
outcome could not be proven (``recovery_required``)."""

from __future__ import annotations

import argparse
from typing import Any

from ql3.cli import human, output, refs
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    next_page_hint,
    positive_int,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
    wants_utc,
)
from ql3.cli.errors import EXIT_OK, UsageError
from ql3.domain.approvals import CLIENT_ID_RE, CODE_RE

OUTCOMES = ("succeeded", "failed", "abandoned")
TERMINAL_BLOCKED = "yes: a blocked action is final, it is never retried and its approval is spent"


def blocked_next_step(action: dict[str, Any], task: str | None) -> str:
    """What a person does about a ``blocked`` action: nothing here; to do it after all, ask again."""
    if action.get("action_type") == "run.create":
        target = task or "TASK"
        return (
            f"to run it after all, request a new approval: ql3 run start {target}, then an approver decides"
        )
    return "to do it after all, request a new approval for it; an approver decides"


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/actions"


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args), params={"cursor": args.cursor, "limit": args.limit})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    items: list[dict[str, Any]] = page["items"]
    if wants_quiet(args):
        output.ids_only(str(a["dispatch_id"]) for a in items)
        if page.get("next_cursor"):
            output.note(next_page_hint("action list", args.parser, args, cursor=str(page["next_cursor"])))
        return EXIT_OK
    utc = wants_utc(args)
    short = human.short_ids(
        [str(a["dispatch_id"]) for a in items] + [str(a["approval_request_id"]) for a in items]
    )
    with ApiClient.from_environment() as api:
        names = refs.TaskNames(api, args.project)
        rows = [
            (
                short[str(a["dispatch_id"])],
                a["effective_status"],
                a["version"],
                refs.action_label(a["action_type"], a["action_ref"], names),
                short[str(a["approval_request_id"])],
                human.when(a["created_at_ms"], utc, label=False),
            )
            for a in items
        ]
    output.table(
        ("ID", "STATUS", "VERSION", "ACTION", "APPROVAL", f"CREATED ({human.zone_label(utc)})"),
        rows,
        status_column=1,
        elastic=(3,),
    )
    blocked = sum(1 for a in items if a["effective_status"] == "blocked")
    if blocked:
        output.note(
            f"{blocked} blocked: final, never retried (their approvals are spent); "
            "`ql3 action show ID` says what to do next"
        )
    if page.get("next_cursor"):
        output.note(next_page_hint("action list", args.parser, args, cursor=str(page["next_cursor"])))
    return EXIT_OK


def _show(action: dict[str, Any], utc: bool, task: str | None = None) -> None:
    """Every field; instants as labelled times and durations in words instead of ``*_ms``. A
    ``blocked`` action also says that it is terminal and what to do next (``task``: its task's name)."""
    pairs: list[tuple[str, Any]] = []
    for key, value in action.items():
        if key.endswith("_at_ms") and (value is None or isinstance(value, int)):
            pairs.append((key[: -len("_at_ms")], human.when(value, utc)))
        elif key.endswith("_ms") and (value is None or isinstance(value, int)):
            pairs.append((key[: -len("_ms")], human.duration(value)))
        else:
            pairs.append((key, value))
    if action.get("effective_status") == "blocked":
        pairs += [("terminal", TERMINAL_BLOCKED), ("next_step", blocked_next_step(action, task))]
    output.fields(pairs, status_key="effective_status")


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, action = api.call("GET", f"{_base(args)}/{seg(args.id)}")
        if wants_json(args):
            output.emit_json(action)
            return EXIT_OK
        task = None
        if action.get("effective_status") == "blocked" and action.get("action_type") == "run.create":
            task = refs.TaskNames(api, args.project).name(str(action["action_ref"]))
    _show(action, wants_utc(args), task)
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"outcome": args.outcome, "expected_version": args.version}
    if args.reason is not None:
        if not CODE_RE.fullmatch(args.reason):
            raise UsageError("--reason must be a code: lowercase letters, digits and _ (at most 64)")
        body["reason_code"] = args.reason
    if args.mutation_id is not None:
        if not CLIENT_ID_RE.fullmatch(args.mutation_id):
            raise UsageError("--mutation-id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
        body["mutation_id"] = args.mutation_id
    with ApiClient.from_environment() as api:
        _, action = api.call("POST", f"{_base(args)}/{seg(args.id)}/resolve", json=body)
    if wants_json(args):
        output.emit_json(action)
    elif not print_quiet_id(args, action["dispatch_id"]):
        output.line(f"action {action['dispatch_id']} {action['status']}")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "action",
        help="approved actions and their manual recovery",
        description="Approved actions. One whose handler may have run but whose outcome is unproven is "
        "recovery_required: it is never retried; a person states the outcome with resolve.",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()

    lst = add_command(actions, "list", cmd_list, "list approved actions, newest first (one page)", proj)
    quiet_flag(lst)
    lst.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    lst.add_argument("--limit", type=positive_int, default=50, metavar="N", help="page size, at most 100")

    show = add_command(actions, "show", cmd_show, "show one approved action", proj)
    show.add_argument("id", metavar="ID", help="action (dispatch) id or a unique prefix of one")
    show.set_defaults(refs={"id": "action"})

    resolve = add_command(
        actions,
        "resolve",
        cmd_resolve,
        "close a recovery_required action (role approver or admin)",
        proj,
    )
    resolve.add_argument("id", metavar="ID", help="action (dispatch) id or a unique prefix of one")
    resolve.set_defaults(refs={"id": "action"})
    quiet_flag(resolve)
    resolve.add_argument(
        "--outcome",
        required=True,
        choices=OUTCOMES,
        help="what really happened: succeeded, failed, or abandoned (unknown; recorded as blocked)",
    )
    resolve.add_argument(
        "--version", type=int, required=True, metavar="V", help="the action's version (show)"
    )
    resolve.add_argument(
        "--reason", default=None, metavar="CODE", help="reason code (default manual_resolution)"
    )
    resolve.add_argument("--mutation-id", default=None, metavar="ID", help="repeat one to replay")
