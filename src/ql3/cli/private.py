"""Keep the server's state private: umask 077, a ``QL3_HOME`` nobody else can enter, 0600 SQLite files.

See docs/security.md ("File modes").
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

from ql3.cli.errors import EXIT_USAGE, CliError

PRIVATE_UMASK: Final = 0o077
# SQLite's own files next to the database: the WAL, its shared-memory index, the rollback journal.
SQLITE_SIDECARS: Final = ("", "-wal", "-shm", "-journal")


def private_umask() -> None:
    """Every file this process creates from now on is 0600 and every directory 0700."""
    os.umask(PRIVATE_UMASK)


def require_private_home(home: Path) -> None:
    """Refuse (exit 64) a ``QL3_HOME`` that exists and that group or others may enter or read.

    A missing home is fine: it will be created 0700 under the private umask.
    """
    try:
        info = os.stat(home)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise CliError("home_not_directory", f"QL3_HOME {home} is not a directory", EXIT_USAGE)
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise CliError(
            "home_not_private",
            f"QL3_HOME {home} has mode {mode:04o}: group or others can reach the database and the"
            f" owner's credentials; run `chmod 700 {home}` and start again",
            EXIT_USAGE,
        )


def tighten_sqlite_files(database_url: str) -> None:
    """chmod 0600 the SQLite database and its sidecars that already exist (made by an older ql3)."""
    if not database_url.startswith("sqlite:///"):
        return
    path = database_url.removeprefix("sqlite://")
    uid = os.geteuid()
    for suffix in SQLITE_SIDECARS:
        candidate = f"{path}{suffix}"
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(candidate, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and info.st_uid == uid and stat.S_IMODE(info.st_mode) & 0o077:
                os.chmod(candidate, 0o600)
