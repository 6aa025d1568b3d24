"""The task user: commands run under another uid than the server's, so that a task cannot read the
server's state (``$QL3_HOME``: credentials, database, journal, other runs' logs and receipts).

The shim itself stays the server's user (it writes the receipt); only the command is started through
``setpriv`` (util-linux), which sets the real and effective uid and gid and the supplementary groups
and execs: one exec more per run, no Python. See docs/security.md ("Run as").
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

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


def resolve_task_user(name: str) -> TaskUser:
    """Look the user up and check the server can switch to it; ConfigurationError otherwise."""
    if not name or len(name) > 64 or any(c.isspace() for c in name):
        raise ConfigurationError("invalid --run-as user name")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigurationError("--run-as: no such user") from None
    if entry.pw_uid == 0:
        raise ConfigurationError("--run-as: the task user must not be root")
    if entry.pw_uid == os.geteuid():
        raise ConfigurationError("--run-as: the task user is the server's own user")
    if os.geteuid() != 0:
        raise ConfigurationError("--run-as needs the server to start as root (to switch users and signal)")
    setpriv = next(
        (p for p in (os.path.join(d, "setpriv") for d in SETPRIV_DIRS) if os.access(p, os.X_OK)), None
    )
    if setpriv is None:
        raise ConfigurationError("--run-as needs setpriv (util-linux)")
    home = entry.pw_dir if entry.pw_dir and entry.pw_dir.startswith("/") else "/"
    return TaskUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=home, setpriv=setpriv)
