"""One ``ql3 serve`` per ``$QL3_HOME``: an flock on ``$QL3_HOME/serve.lock`` held while it runs."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from ql3.cli.errors import CliError

LOCK_FILE: Final = "serve.lock"
EXIT_ALREADY_SERVING: Final = 75  # EX_TEMPFAIL: another ql3 serve holds this QL3_HOME


@contextlib.contextmanager
def home_lock(base: Path) -> Iterator[Path]:
    """Hold ``$QL3_HOME/serve.lock`` (flock) for as long as this server runs.

    A second ``ql3 serve`` on the same home stops here, before it writes anything. The kernel
    drops the lock when the process ends, also after ``kill -9``: there is no stale lock to clean."""
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = base / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CliError(
                "already_serving",
                f"a ql3 server already runs for QL3_HOME={base} (it holds {path}); stop it first, or "
                "give this one its own QL3_HOME",
                EXIT_ALREADY_SERVING,
            ) from None
        yield path
    finally:
        os.close(fd)
