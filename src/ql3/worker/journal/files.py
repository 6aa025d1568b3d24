"""File plumbing of the journal: a private directory and file, the single-owner ``flock``, fsync."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from ql3.domain.journal import JournalLocked, JournalUnavailable


def ensure_private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return
    # mkdir's mode is filtered by the umask; the directory we created must be exactly 0700.
    os.chmod(directory, 0o700)


def acquire_lock(lock_path: Path) -> int:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JournalUnavailable() from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.fchmod(fd, 0o600)
    except BlockingIOError:
        os.close(fd)
        raise JournalLocked() from None
    except OSError as exc:
        os.close(fd)
        raise JournalUnavailable() from exc
    # The previous owner may have unlinked the name between our open and our flock.
    try:
        same = os.path.samestat(os.stat(lock_path), os.fstat(fd))
    except OSError:
        same = False
    if not same:
        release_lock(fd)
        raise JournalLocked()
    return fd


def release_lock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def create_private_file(path: Path) -> bool:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
        created = False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JournalUnavailable(reason="not_a_file")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return created


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
