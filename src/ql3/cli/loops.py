"""``ql3 loops parked`` and ``ql3 loops retry``: the items the control loops parked
(docs/operations.md "Parked items")."""

from __future__ import annotations

import argparse

from ql3.cli import human, output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
    wants_utc,
)
from ql3.cli.errors import EXIT_OK

MAX_LIMIT = 200


def _limit(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None
    if not 1 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be 1-{MAX_LIMIT}")
    return n


def cmd_parked(args: argparse.Namespace) -> int:
    path = "/parked-items" if args.all else f"/projects/{seg(args.project)}/parked-items"
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", path, params={"limit": args.limit})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    if wants_quiet(args):
        output.ids_only(f"{i['item_kind']}/{i['item_key']}" for i in page["items"])
        return EXIT_OK
    utc = wants_utc(args)
    output.table(
        ("LOOP", "KIND", "ID", "REASON", "FAILURES", f"LAST ({human.zone_label(utc)})", "NEXT RETRY"),
        [
            (
                i["loop"],
                i["item_kind"],
                i["item_key"],
                i["reason"]
                if not i.get("error_type") or i["reason"] != "unexpected_error"
                else f"{i['reason']} ({i['error_type']})",
                i["failures"],
                human.when(i["last_failed_at_ms"], utc, label=False),
                human.when(i["next_retry_at_ms"], utc, label=False),
            )
            for i in page["items"]
        ],
        elastic=(2,),
    )
    if not page["items"]:
        output.note("no parked items: every loop handles all of its items")
    elif page.get("truncated"):
        output.note(f"more than {args.limit} parked items; see --limit or the API")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    tail = f"/parked-items/{seg(args.kind)}/{seg(args.key)}/retry"
    path = tail if args.all else f"/projects/{seg(args.project)}{tail}"
    with ApiClient.from_environment() as api:
        _, item = api.call("POST", path)
    if wants_json(args):
        output.emit_json(item)
    else:
        output.line(f"{item['item_kind']} {item['item_key']}: the {item['loop']} loop retries it now")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "loops",
        help="the control loops' parked items",
        description="Items a control loop failed to handle with a non-transient error are parked: "
        "skipped with a backoff while the loop goes on with the others.",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    parked = add_command(
        actions, "parked", cmd_parked, "list parked items (the project's, or --all)", project_flag()
    )
    parked.add_argument(
        "--all", action="store_true", help="every parked item of the server (owner or admin of default)"
    )
    parked.add_argument(
        "--limit", type=_limit, default=MAX_LIMIT, metavar="N", help=f"at most N (1-{MAX_LIMIT})"
    )
    quiet_flag(parked)
    retry = add_command(
        actions, "retry", cmd_retry, "retry a parked item now (operator or admin)", project_flag()
    )
    retry.add_argument("kind", metavar="KIND", help="the item's kind (approval, lease, retry, schedule, ...)")
    retry.add_argument("key", metavar="ID", help="the item's id")
    retry.add_argument("--all", action="store_true", help="server-wide scope (owner or admin of default)")
