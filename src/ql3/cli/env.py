"""``ql3 env``: the project's variables and secrets (docs/variables.md): set, list, rm, import."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ql3.cli import human, output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, wants_json, wants_utc
from ql3.cli.errors import EXIT_OK, UsageError
from ql3.domain.variables import MAX_IMPORT_BYTES


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/variables"


def cmd_set(args: argparse.Namespace) -> int:
    value = args.value
    if value == "-":  # a secret need not pass through the shell's history or the process list
        value = sys.stdin.read().removesuffix("\n")
    body = {"value": value, "secret": args.secret, "enabled": not args.disabled, "note": args.note or ""}
    with ApiClient.from_environment() as api:
        _, var = api.call("PUT", f"{_base(args)}/{seg(args.key)}", json=body)
    if wants_json(args):
        output.emit_json(var)
    else:
        kind = "secret" if var["secret"] else "variable"
        output.line(f"{kind} {var['name']} set" + ("" if var["enabled"] else " (disabled)"))
    return EXIT_OK


def _shown(var: dict[str, Any]) -> str:
    if var["secret"]:
        return "(secret)"
    value = var.get("value")
    return "(hidden)" if value is None else str(value)


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _base(args))
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    output.table(
        ("NAME", "VALUE", "ENABLED", "NOTE", "UPDATED"),
        [
            (v["name"], _shown(v), v["enabled"], v["note"], human.when(v["updated_at_ms"], wants_utc(args)))
            for v in page["items"]
        ],
        elastic=(1, 3),
    )
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        api.call("DELETE", f"{_base(args)}/{seg(args.key)}")
    if wants_json(args):
        output.emit_json({"deleted": True, "name": args.key})
    else:
        output.line(f"variable {args.key} removed")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        raw = sys.stdin.buffer.read(MAX_IMPORT_BYTES + 1) if args.file == "-" else path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{args.file} is not UTF-8 text") from None
    with ApiClient.from_environment() as api:
        _, result = api.call("POST", _base(args), json={"text": text, "secret": args.secret})
    if wants_json(args):
        output.emit_json(result)
    else:
        output.line(f"imported {result['imported']} variables: {', '.join(result['names'])}")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "env",
        help="the project's variables and secrets",
        description="Project variables: every task of the project gets the enabled ones in its"
        " environment (a task's own --env value wins). Secrets are write-only and encrypted at rest.",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()
    setter = add_command(
        actions,
        "set",
        cmd_set,
        "create or replace a variable",
        proj,
        epilog="examples: ql3 env set REGION cn --note 'where to sign in'\n"
        "  ql3 env set JD_COOKIE - --secret < cookie.txt   # the value from stdin",
    )
    setter.add_argument("key", metavar="KEY", help="a letter or _ then letters, digits or _")
    setter.add_argument("value", metavar="VALUE", help="the value, or - to read it from stdin")
    setter.add_argument(
        "--secret", action="store_true", help="write-only: never shown again, encrypted at rest"
    )
    setter.add_argument("--note", metavar="TEXT", help="a remark shown in lists (at most 256 characters)")
    setter.add_argument("--disabled", action="store_true", help="keep it, but give it to no task")
    add_command(actions, "list", cmd_list, "list the variables (secrets without values)", proj)
    remover = add_command(actions, "rm", cmd_rm, "remove a variable", proj)
    remover.add_argument("key", metavar="KEY")
    importer = add_command(
        actions,
        "import",
        cmd_import,
        "import KEY=VALUE lines or QingLong's env export (JSON), all or nothing",
        proj,
    )
    importer.add_argument("file", metavar="FILE", help="the file, or - for stdin")
    importer.add_argument("--secret", action="store_true", help="store every imported value as a secret")
