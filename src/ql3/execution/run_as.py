"""The task user: commands run under another uid than the server's, so that a task cannot read the
server's state (``$QL3_HOME``: credentials, database, journal, other runs' logs and receipts).

The shim itself stays the server's user (it writes the receipt); only the command is started through
``setpriv`` (util-linux), which sets the real and effective uid and gid and the supplementary groups
and execs: one exec more per run, no Python. ``TaskUsers`` picks the user per project
(``--project-run-as PROJECT=USER``), with ``--run-as`` as the default. See docs/security.md ("Run as").
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ql3.domain.errors import ConfigurationError

SETPRIV_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskUser:
    name: str
    uid: int
    gid: int
    home: str
    setpriv: str

    def command_prefix(self) -> str:
        """The words the shim puts before the command (split on spaces: none of them holds one)."""
        return f"{self.setpriv} --reuid={self.uid} --regid={self.gid} --init-groups --"

    def environment(self) -> dict[str, str]:
        """Who the task is: its own HOME, never the server's (which may hold ``~/.ql3``)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskUsers:
    """Who each project's commands run as: a per-project user where one is configured, else the
    default (``--run-as``). ``None`` stands for the server's own user (no switch)."""

    default: TaskUser | None = None
    projects: Mapping[str, TaskUser | None] = field(default_factory=lambda: MappingProxyType({}))

    def for_project(self, project_id: str | None) -> TaskUser | None:
        if project_id is not None and project_id in self.projects:
            return self.projects[project_id]
        return self.default

    def runs_as_server(self) -> list[str]:
        """Project ids explicitly configured to run as the server's own user."""
        return sorted(p for p, user in self.projects.items() if user is None)


def resolve_task_user(
    name: str, *, flag: str = "--run-as", allow_server_user: bool = False
) -> TaskUser | None:
    """Look the user up and check the server can switch to it; ConfigurationError otherwise.

    The server's own user is refused unless ``allow_server_user`` (then None: nothing to switch)."""
    if not name or len(name) > 64 or any(c.isspace() for c in name):
        raise ConfigurationError(f"invalid {flag} user name")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigurationError(f"{flag}: no such user") from None
    if entry.pw_uid == os.geteuid():
        if allow_server_user:
            return None
        raise ConfigurationError(
            f"{flag}: the task user is the server's own user (allow it with --allow-server-user)"
        )
    if entry.pw_uid == 0:
        raise ConfigurationError(f"{flag}: the task user must not be root")
    if os.geteuid() != 0:
        raise ConfigurationError(f"{flag} needs the server to start as root (to switch users and signal)")
    setpriv = next(
        (p for p in (os.path.join(d, "setpriv") for d in SETPRIV_DIRS) if os.access(p, os.X_OK)), None
    )
    if setpriv is None:
        raise ConfigurationError(f"{flag} needs setpriv (util-linux)")
    home = entry.pw_dir if entry.pw_dir and entry.pw_dir.startswith("/") else "/"
    return TaskUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=home, setpriv=setpriv)
