"""``ql3 completion bash|zsh|fish``: shell completion generated from the argparse parser.

argcomplete (a well-kept library) writes a small shell function; on TAB the shell runs ``ql3`` with
``_ARGCOMPLETE`` set, and ``autocomplete`` answers from the very parser ``ql3`` parses with, so the
completions can never drift from the commands.

Every ``TASK`` argument also completes task names: the completer asks the server (the CLI's own
credentials, the ``--project`` already typed) for the names from the typed prefix on, in name order,
and stops at the first name past the prefix: at most ``MAX_COMPLETION_PAGES`` pages, each request
within ``COMPLETION_TIMEOUT_S``. An unreachable server or no credentials complete nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Final

from ql3.cli import output
from ql3.cli.client import seg, split_urls
from ql3.cli.common import Subparsers, add_command
from ql3.cli.config import resolve_credentials
from ql3.cli.errors import EXIT_OK, CliError

SHELLS: Final = ("bash", "zsh", "fish")
INSTALL_HELP: Final = """\
install:
  bash   ql3 completion bash > ~/.local/share/bash-completion/completions/ql3
  zsh    ql3 completion zsh > "${fpath[1]}/_ql3"     (or: eval "$(ql3 completion zsh)" in ~/.zshrc)
  fish   ql3 completion fish > ~/.config/fish/completions/ql3.fish

TASK arguments complete the project's task names, asked from the server with ql3's credentials
(nothing is offered when it cannot be reached within 2 s).
"""


def autocomplete(build: Callable[[], argparse.ArgumentParser]) -> None:
    """Answer the shell's completion request and exit; return at once on an ordinary run."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    parser = build()
    for action in _task_actions(parser):
        action.completer = complete_task_names  # type: ignore[attr-defined]
    argcomplete.autocomplete(parser, always_complete_options=False)


def _task_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument named TASK, in ``parser`` and its subcommands (a bounded walk of the tree)."""
    found: list[argparse.Action] = []
    stack, seen = [parser], 0
    while stack and seen < MAX_PARSERS:
        current = stack.pop()
        seen += 1
        for action in current._actions:
            if action.metavar == "TASK":
                found.append(action)
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return found


MAX_PARSERS: Final = 1000  # parsers visited at most (ql3 has about 150)
MAX_COMPLETION_PAGES: Final = 3
COMPLETION_PAGE: Final = 200  # the API's largest task page
COMPLETION_TIMEOUT_S: Final = 2.0


def _just_below(prefix: str) -> str:
    """A cursor whose next page starts at the names beginning with ``prefix``: the list returns the
    names after the cursor, so step the last character back by one."""
    if not prefix:
        return ""
    last = ord(prefix[-1])
    return prefix[:-1] + (chr(last - 1) if last > 0 else "")


def task_names(prefix: str, project: str, get: Callable[[str, dict[str, Any]], Any]) -> list[str]:
    """The names starting with ``prefix``, from pages ``get(path, params)`` returns, in name order."""
    names: list[str] = []
    cursor = _just_below(prefix)
    for _ in range(MAX_COMPLETION_PAGES):
        params: dict[str, Any] = {"limit": COMPLETION_PAGE}
        if cursor:
            params["cursor"] = cursor
        page = get(f"/projects/{seg(project)}/tasks", params)
        for item in page["items"]:
            name = str(item["name"])
            if name.startswith(prefix):
                names.append(name)
            elif name > prefix:
                return names  # past every name with the prefix
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return names


def complete_task_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """argcomplete's completer for TASK: names from the server, or nothing when it cannot say."""
    import httpx

    try:
        creds = resolve_credentials()
    except CliError:
        return []
    project = getattr(parsed_args, "project", None) or "default"
    base = split_urls(creds.url)[0]
    headers = {"Authorization": f"Bearer {creds.token}"}
    with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=COMPLETION_TIMEOUT_S) as http:

        def get(path: str, params: dict[str, Any]) -> Any:
            answer = http.get(path, params=params)
            answer.raise_for_status()
            return answer.json()

        try:
            return task_names(prefix, project, get)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return []


def cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    script: Any = shellcode(["ql3"], shell=args.shell)
    output.line(str(script).rstrip("\n"))
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    cmd = add_command(
        subparsers,
        "completion",
        cmd_completion,
        "print the shell completion script for bash, zsh or fish",
        epilog=INSTALL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("shell", choices=SHELLS, help="the shell to complete in")
