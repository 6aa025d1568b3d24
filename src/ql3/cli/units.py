"""systemd units for ``ql3 serve``, ``ql3 control`` and ``ql3 worker`` (``--print-systemd-unit``).

Each unit runs the very installation that printed it (the same ``ql3`` binary), with the same
``QL3_HOME`` and options, as the user that printed it. Running tasks outlive a restart of their
server or worker and are re-adopted when it is back, so every unit stops only the main process
(``KillMode=process``), never the tasks' process groups.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def ql3_program() -> list[str]:
    """The command that starts this very installation of ql3."""
    beside = Path(sys.executable).parent / "ql3"  # the same installation as this process
    found = str(beside) if beside.exists() else shutil.which("ql3")
    return [str(Path(found).absolute())] if found else [sys.executable, "-m", "ql3.cli.main"]


def current_user() -> str:
    try:
        return os.getlogin()
    except OSError:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name


def kept_environment(env: Mapping[str, str], names: Iterable[str]) -> list[str]:
    """``NAME=value`` for each of ``names`` set in ``env`` (the settings the unit must keep)."""
    return [f"{name}={env[name]}" for name in names if env.get(name)]


def _specifiers(text: str) -> str:
    """systemd expands ``%x`` specifiers in these lines: a literal ``%`` (a percent-encoded password
    in a database URL) is written ``%%``."""
    return text.replace("%", "%%")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One service unit. ``user``: the ``User=`` line (the user the process starts as; a process
    that runs its tasks as other users with ``--run-as`` starts as root)."""

    name: str  # the file name without .service, e.g. ``ql3-worker``
    description: str
    command: Sequence[str]
    user: str
    environment: Sequence[str] = ()
    stop_notes: Sequence[str] = ()  # comment lines above KillMode=
    stop_timeout_s: int = 30
    no_restart: Mapping[int, str] = field(default_factory=dict)  # exit status -> why no restart helps

    def render(self) -> str:
        reasons = "; ".join(f"{code}: {why}" for code, why in sorted(self.no_restart.items()))
        codes = " ".join(str(code) for code in sorted(self.no_restart))
        return "\n".join(
            [
                f"# ql3: save as /etc/systemd/system/{self.name}.service (or"
                f" ~/.config/systemd/user/{self.name}.service",
                f"# without User=), then: systemctl daemon-reload && systemctl enable --now {self.name}",
                "[Unit]",
                f"Description={self.description}",
                "After=network-online.target",
                "Wants=network-online.target",
                "",
                "[Service]",
                "Type=exec",
                f"User={self.user}",
                *[f"Environment={_specifiers(shlex.quote(item))}" for item in self.environment],
                f"ExecStart={_specifiers(shlex.join(self.command))}",
                *[f"# {line}" for line in self.stop_notes],
                "KillMode=process",
                "KillSignal=SIGTERM",
                f"TimeoutStopSec={self.stop_timeout_s}",
                "Restart=on-failure",
                "RestartSec=5",
                *([f"# {reasons} (no restart helps)"] if reasons else []),
                *([f"RestartPreventExitStatus={codes}"] if codes else []),
                "",
                "[Install]",
                "# a user unit (~/.config/systemd/user): WantedBy=default.target",
                "WantedBy=multi-user.target",
                "",
            ]
        )
