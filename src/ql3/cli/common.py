"""Parser plumbing shared by the command groups."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ql3.cli.errors import EXIT_USAGE, UsageError

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
    return parent


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
    parser.set_defaults(handler=handler)
    return parser


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


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


def seconds_to_ms(value: float | None, what: str) -> int | None:
    if value is None:
        return None
    if value != value or value <= 0 or value > 10**9:  # NaN or out of range
        raise UsageError(f"{what} must be a positive number of seconds")
    return max(1, round(value * 1000))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
