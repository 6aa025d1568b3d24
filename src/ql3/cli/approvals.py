"""``ql3 approval list | show | approve | reject``, and what ``run start`` prints for an
approval-required task (no run exists until another user approves the request)."""

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
from ql3.domain.approvals import APPROVAL_STATES, CODE_RE, MAX_DECISION_NOTE, validate_note
from ql3.domain.errors import ValidationFailed


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/approvals"


def _reason(value: str | None) -> str | None:
    if value is not None and not CODE_RE.fullmatch(value):
        raise UsageError("--reason must be a code: lowercase letters, digits and _ (at most 64)")
    return value


def _show(api: ApiClient, args: argparse.Namespace, approval: dict[str, Any]) -> None:
    utc = wants_utc(args)
    names = refs.TaskNames(api, args.project)
    output.fields(
        [
            ("id", approval["id"]),
            ("state", approval["state"]),
            ("effective_state", approval.get("effective_state")),
            ("action", refs.action_label(approval.get("action_type"), approval.get("action_ref"), names)),
            ("task_revision", approval.get("task_revision")),
            ("requested_by", refs.principal_name(api, args.project, approval.get("requested_by"))),
            ("requested", human.when(approval.get("requested_at_ms"), utc)),
            ("expires", human.when(approval.get("expires_at_ms"), utc)),
            ("decision", approval.get("decision")),
            ("reason", approval.get("reason_code")),
            ("note", approval.get("note")),
            ("decided_by", refs.principal_name(api, args.project, approval.get("decided_by"))),
            ("decided", human.when(approval.get("decided_at_ms"), utc)),
            ("dispatch_id", approval.get("dispatch_id")),
        ],
        status_key="effective_state",
    )


def print_requested(args: argparse.Namespace, body: dict[str, Any]) -> int:
    """``run start`` of an approval-required task: the answer is an approval request, not a run.

    Exit 0, also with ``--wait``/``--follow``: there is no run to wait for until it is approved."""
    approval = body["approval"]
    if print_quiet_id(args, approval["id"]):
        return EXIT_OK
    if wants_json(args):
        output.emit_json(body)
    else:
        output.line(f"approval {approval['id']} requested: the run is created once another user approves")
        output.note(f"approve with: ql3 approval approve {str(approval['id'])[: human.SHORT_ID]}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    params = {"state": args.state, "cursor": args.cursor, "limit": args.limit}
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args), params=params)
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    items: list[dict[str, Any]] = page["items"]
    if wants_quiet(args):
        output.ids_only(str(a["id"]) for a in items)
        if page.get("next_cursor"):
            output.note(next_page_hint("approval list", args.parser, args, cursor=str(page["next_cursor"])))
        return EXIT_OK
    utc = wants_utc(args)
    short = human.short_ids(str(a["id"]) for a in items)
    with ApiClient.from_environment() as api:
        names = refs.TaskNames(api, args.project)
        rows = [
            (
                short[str(a["id"])],
                a["effective_state"],
                refs.action_label(a["action_type"], a["action_ref"], names),
                human.when(a["requested_at_ms"], utc, label=False),
                human.when(a["expires_at_ms"], utc, label=False),
            )
            for a in items
        ]
    zone = human.zone_label(utc)
    output.table(
        ("ID", "STATE", "ACTION", f"REQUESTED ({zone})", f"EXPIRES ({zone})"),
        rows,
        status_column=1,
        elastic=(2,),
    )
    if page.get("next_cursor"):
        output.note(next_page_hint("approval list", args.parser, args, cursor=str(page["next_cursor"])))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, approval = api.call("GET", f"{_base(args)}/{seg(args.id)}")
        if wants_json(args):
            output.emit_json(approval)
        else:
            _show(api, args, approval)
    return EXIT_OK


def _decide(args: argparse.Namespace, verb: str) -> int:
    body: dict[str, Any] = {}
    reason = _reason(args.reason)
    if reason is not None:
        body["reason_code"] = reason
    if args.note is not None:
        try:
            note = validate_note(args.note)
        except ValidationFailed as exc:
            raise UsageError(f"--note: {exc}") from exc
        if note is not None:
            body["note"] = note
    if args.decision_id is not None:
        body["decision_id"] = args.decision_id
    with ApiClient.from_environment() as api:
        _, approval = api.call("POST", f"{_base(args)}/{seg(args.id)}/{verb}", json=body)
    if print_quiet_id(args, approval["id"]):
        return EXIT_OK
    if wants_json(args):
        output.emit_json(approval)
    else:
        output.line(f"approval {approval['id']} {approval['state']}")
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, "approve")


def cmd_reject(args: argparse.Namespace) -> int:
    return _decide(args, "reject")


def cmd_policy(args: argparse.Namespace) -> int:
    path = f"/projects/{seg(args.project)}/approval-policy"
    with ApiClient.from_environment() as api:
        if args.second_admin is None:
            _, policy = api.call("GET", path)
        else:
            _, policy = api.call("PUT", path, json={"second_admin": args.second_admin})
    if wants_json(args):
        output.emit_json(policy)
    else:
        output.line(
            "decider: never the requester nor a principal whose token the requester issued"
            + ("; an admin who did not issue the requester's token" if policy["second_admin"] else "")
        )
        output.line(f"second_admin: {'on' if policy['second_admin'] else 'off'}")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "approval",
        help="decide approval requests",
        description="Approval requests: a run of an approval-required task waits for another user's "
        "decision (role approver or admin; never the requester).",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()

    lst = add_command(actions, "list", cmd_list, "list approval requests, newest first (one page)", proj)
    quiet_flag(lst)
    lst.add_argument("--state", choices=APPROVAL_STATES, default=None, help="only requests in this state")
    lst.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    lst.add_argument("--limit", type=positive_int, default=50, metavar="N", help="page size, at most 100")

    show = add_command(actions, "show", cmd_show, "show one approval request", proj)
    show.add_argument("id", metavar="ID", help="approval id or a unique prefix of one")
    show.set_defaults(refs={"id": "approval"})

    for name, handler, help_text, reason_required in (
        ("approve", cmd_approve, "approve a request (the run is then created)", False),
        ("reject", cmd_reject, "reject a request", True),
    ):
        cmd = add_command(actions, name, handler, help_text, proj)
        quiet_flag(cmd)
        cmd.add_argument("id", metavar="ID", help="approval id or a unique prefix of one")
        cmd.set_defaults(refs={"id": "approval"})
        cmd.add_argument(
            "--reason",
            required=reason_required,
            default=None,
            metavar="CODE",
            help="reason code, e.g. change_window" + ("" if reason_required else " (default: approved)"),
        )
        cmd.add_argument(
            "--note",
            default=None,
            metavar="TEXT",
            help=f"free text stored with the decision (at most {MAX_DECISION_NOTE} characters)",
        )
        cmd.add_argument("--decision-id", default=None, metavar="ID", help="repeat one to replay a decision")

    policy = add_command(
        actions,
        "policy",
        cmd_policy,
        "show or set who may decide this project's requests (docs/security.md, separation of duty)",
        proj,
    )
    policy.add_argument(
        "--second-admin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="require an admin who did not issue the requester's token (directly or through others);"
        " --no-second-admin: the default policy (never the requester nor a token it issued)",
    )
