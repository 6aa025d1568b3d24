"""``ql3 action list | show | resolve``: approved actions and the manual recovery of one whose
outcome could not be proven (``recovery_required``)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, positive_int, project_flag, wants_json
from ql3.cli.errors import EXIT_OK, UsageError
from ql3.domain.approvals import CLIENT_ID_RE, CODE_RE

OUTCOMES = ("succeeded", "failed", "abandoned")


def _when(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/actions"


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args), params={"cursor": args.cursor, "limit": args.limit})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    output.table(
        ("ID", "STATUS", "VERSION", "ACTION", "APPROVAL", "CREATED"),
        [
            (
                a["dispatch_id"],
                a["effective_status"],
                a["version"],
                f"{a['action_type']} {a['action_ref']}",
                a["approval_request_id"],
                _when(a["created_at_ms"]),
            )
            for a in page["items"]
        ],
    )
    if page.get("next_cursor"):
        output.note(f"more: ql3 action list --cursor {page['next_cursor']}")
    return EXIT_OK


def _show(action: dict[str, Any]) -> None:
    output.fields([(k, v) for k, v in action.items()])


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, action = api.call("GET", f"{_base(args)}/{seg(args.id)}")
    if wants_json(args):
        output.emit_json(action)
    else:
        _show(action)
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"outcome": args.outcome, "expected_version": args.version}
    if args.reason is not None:
        if not CODE_RE.match(args.reason):
            raise UsageError("--reason must be a code: lowercase letters, digits and _ (at most 64)")
        body["reason_code"] = args.reason
    if args.mutation_id is not None:
        if not CLIENT_ID_RE.match(args.mutation_id):
            raise UsageError("--mutation-id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
        body["mutation_id"] = args.mutation_id
    with ApiClient.from_environment() as api:
        _, action = api.call("POST", f"{_base(args)}/{seg(args.id)}/resolve", json=body)
    if wants_json(args):
        output.emit_json(action)
    else:
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
    lst.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    lst.add_argument("--limit", type=positive_int, default=50, metavar="N", help="page size, at most 100")

    show = add_command(actions, "show", cmd_show, "show one approved action", proj)
    show.add_argument("id", metavar="ID", help="action (dispatch) id")

    resolve = add_command(
        actions,
        "resolve",
        cmd_resolve,
        "close a recovery_required action (role approver or admin)",
        proj,
    )
    resolve.add_argument("id", metavar="ID", help="action (dispatch) id")
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
