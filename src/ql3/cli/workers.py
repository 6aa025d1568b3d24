"""``ql3 worker list``, ``ql3 worker show`` and ``ql3 worker drain``."""

from __future__ import annotations

import argparse
from typing import Any

from ql3.cli import human, output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    next_page_hint,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
    wants_utc,
)
from ql3.cli.errors import EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"/projects/{seg(args.project)}/workers", params={"after": args.after})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    if wants_quiet(args):
        output.ids_only(str(w["id"]) for w in page["items"])
        return EXIT_OK
    output.table(
        (
            "ID",
            "STATUS",
            "GEN",
            "BUSY",
            "SLOTS",
            "LABELS",
            f"HEARTBEAT ({human.zone_label(wants_utc(args))})",
        ),
        [
            (
                w["id"],
                w["status"],
                w["generation"],
                w["busy"],
                w["slots"],
                _labels(w) or None,
                human.when(w.get("last_heartbeat_at_ms"), wants_utc(args), label=False),
            )
            for w in page["items"]
        ],
        status_column=1,
        elastic=(0, 5),
    )
    if page.get("next_after"):
        output.note(next_page_hint("worker list", args.parser, args, after=str(page["next_after"])))
    return EXIT_OK


def _labels(worker: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(worker.get("labels", {}).items()))


def cmd_show(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, w = api.call("GET", f"/projects/{seg(args.project)}/workers/{seg(args.worker)}")
    if wants_json(args):
        output.emit_json(w)
        return EXIT_OK
    output.line(f"worker     {w['id']}")
    output.line(f"status     {w['status']} (generation {w['generation']})")
    output.line(f"slots      {w['busy']} busy of {w['slots']}")
    output.line(f"labels     {_labels(w) or '-'}")
    output.line(f"executors  {','.join(w.get('executors', [])) or '-'}")
    output.line(f"heartbeat  {human.when(w.get('last_heartbeat_at_ms'), wants_utc(args)) or '-'}")
    return EXIT_OK


def cmd_drain(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, worker = api.call("POST", f"/workers/{seg(args.worker)}/drain")
    if wants_json(args):
        output.emit_json(worker)
    elif not print_quiet_id(args, worker["id"]):
        output.line(f"worker {worker['id']} {worker['status']}: it gets no new runs; its runs go on")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    from ql3.cli import worker_remote

    group: Parser = subparsers.add_parser(
        "worker", help="inspect and drain workers, or run a remote worker", description="Workers."
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=False)
    worker_remote.register(group, actions)
    lst = add_command(actions, "list", cmd_list, "list the registered workers (one page)", project_flag())
    lst.add_argument("--after", default=None, metavar="ID", help="the next_after of the previous page")
    quiet_flag(lst)
    show = add_command(
        actions, "show", cmd_show, "one worker: labels, slots, busy slots, status", project_flag()
    )
    show.add_argument("worker", metavar="ID", help="worker id or a unique prefix of one")
    show.set_defaults(refs={"worker": "worker"})
    drain = add_command(
        actions, "drain", cmd_drain, "stop giving a worker new runs (owner or admin of default)"
    )
    drain.add_argument("worker", metavar="ID", help="worker id or a unique prefix of one")
    drain.set_defaults(refs={"worker": "worker"})
    quiet_flag(drain)
