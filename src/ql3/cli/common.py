"""Parser plumbing shared by the command groups."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ql3.cli.errors import EXIT_USAGE, UsageError
from ql3.domain.durations import parse_duration_ms
from ql3.domain.errors import ValidationFailed

Handler = Callable[[argparse.Namespace], int]
Subparsers = Any  # argparse's _SubParsersAction is private


class Parser(argparse.ArgumentParser):
    """argparse with the usage exit code 64 (EX_USAGE) instead of 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def json_flag() -> Parser:
    # SUPPRESS keeps a subcommand from resetting a ``--json`` given before it.
    parent = Parser(add_help=False)
    parent.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    parent.add_argument(
        "--utc", action="store_true", default=argparse.SUPPRESS, help="show times in UTC, not local"
    )
    return parent


def quiet_flag(parser: Parser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the full ids, one a line")


def project_flag() -> Parser:
    parent = Parser(add_help=False)
    parent.add_argument(
        "--project", "-p", default="default", metavar="P", help="project name or id (default: default)"
    )
    return parent


def add_command(
    subparsers: Subparsers, name: str, handler: Handler, help_text: str, *parents: Parser, **kwargs: Any
) -> Parser:
    parser: Parser = subparsers.add_parser(
        name, help=help_text, description=help_text, parents=[json_flag(), *parents], **kwargs
    )
    parser.set_defaults(handler=handler, parser=parser)
    return parser


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def wants_utc(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "utc", False))


def wants_quiet(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "quiet", False)) and not wants_json(args)


def print_quiet_id(args: argparse.Namespace, ident: object) -> bool:
    """``-q`` of a command that prints one id (``id=$(ql3 run start job -q)``): the full id alone on
    stdout, and True so that the caller prints nothing else."""
    if not wants_quiet(args):
        return False
    sys.stdout.write(f"{ident}\n")
    return True


def key_values(values: list[str] | None, what: str) -> dict[str, str]:
    """``K=V`` pairs; a malformed or repeated key is a usage error."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} must be KEY=VALUE")
        if key in out:
            raise UsageError(f"{what} key given twice")
        out[key] = value
    return out


def preferences(values: list[str] | None) -> list[dict[str, Any]]:
    """``k=v[:weight]`` entries, one label each."""
    out: list[dict[str, Any]] = []
    for item in values or []:
        key, sep, rest = item.partition("=")
        if not sep or not key:
            raise UsageError("--prefer must be KEY=VALUE[:WEIGHT]")
        value, weight = rest, 1
        head, colon, tail = rest.rpartition(":")
        if colon and tail.isdigit():
            value, weight = head, int(tail)
        out.append({"labels": {key: value}, "weight": weight})
    return out


def duration_s(text: str) -> float:
    """An argparse type: seconds from ``90``, ``2.5``, ``90s``, ``5m``, ``1h30m``... (docs/tasks.md)."""
    try:
        return parse_duration_ms(text) / 1000
    except ValidationFailed as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("invalid duration ")) from None


def duration_ms(text: str, what: str) -> int:
    """Milliseconds from a duration option's text; a usage error (exit 64) naming the forms."""
    try:
        return parse_duration_ms(text)
    except ValidationFailed as exc:
        raise UsageError(f"{what} {str(exc).removeprefix('invalid duration ')}") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


_NOT_REPEATED = frozenset({"cursor", "json", "utc", "quiet", "help", "after"})


def next_page_hint(
    command: str, parser: argparse.ArgumentParser, args: argparse.Namespace, **page: str
) -> str:
    """``more: ql3 run list --task hello --limit 2 --cursor C``: every option the user gave is kept,
    so following the hint continues the same listing (names as typed, not resolved ids)."""
    given: dict[str, str] = getattr(args, "given", None) or {}
    words = ["ql3", *command.split()]
    for action in parser._actions:
        if not action.option_strings or action.dest in _NOT_REPEATED:
            continue
        value = given.get(action.dest, getattr(args, action.dest, None))
        if value is None or value == action.default or value is False:
            continue
        flag = max(action.option_strings, key=len)
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, str(value)]
    for flag, value in page.items():
        words += [f"--{flag}", value]
    return "more: " + " ".join(shlex.quote(w) for w in words)
