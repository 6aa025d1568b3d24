"""``ql3 completion bash|zsh|fish``: shell completion generated from the argparse parser.

argcomplete (a well-kept library) writes a small shell function; on TAB the shell runs ``ql3`` with
``_ARGCOMPLETE`` set, and ``autocomplete`` answers from the very parser ``ql3`` parses with, so the
completions can never drift from the commands.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Final

from ql3.cli import output
from ql3.cli.common import Subparsers, add_command
from ql3.cli.errors import EXIT_OK

SHELLS: Final = ("bash", "zsh", "fish")
INSTALL_HELP: Final = """\
install:
  bash   ql3 completion bash > ~/.local/share/bash-completion/completions/ql3
  zsh    ql3 completion zsh > "${fpath[1]}/_ql3"     (or: eval "$(ql3 completion zsh)" in ~/.zshrc)
  fish   ql3 completion fish > ~/.config/fish/completions/ql3.fish
"""


def autocomplete(build: Callable[[], argparse.ArgumentParser]) -> None:
    """Answer the shell's completion request and exit; return at once on an ordinary run."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(build(), always_complete_options=False)


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
