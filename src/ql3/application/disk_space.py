"""Free space where ql3 writes: what ``/readyz`` calls ``disk_full`` and what a start on a full disk
is refused for (docs/operations.md "A full disk")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

# Below this much free space (for the server's user) a directory ql3 writes to counts as full.
MIN_FREE_BYTES: Final = 1 << 20
# A directory that does not exist yet is judged by its nearest existing ancestor (its disk to be).
MAX_ANCESTORS: Final = 64


def free_bytes(path: Path) -> int | None:
    """Bytes free for an unprivileged writer on the disk of ``path`` (or of its nearest existing
    ancestor); None when it cannot be told."""
    candidate = Path(os.path.abspath(path))
    for _ in range(MAX_ANCESTORS):
        try:
            st = os.statvfs(candidate)
        except FileNotFoundError:
            if candidate.parent == candidate:
                return None
            candidate = candidate.parent
            continue
        except OSError:
            return None
        return st.f_bavail * st.f_frsize
    return None


def full_disks(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The directories among ``paths`` with less than MIN_FREE_BYTES free, with what is free."""
    full = []
    for path in paths:
        free = free_bytes(path)
        if free is not None and free < MIN_FREE_BYTES:
            full.append({"path": str(path), "free_bytes": free})
    return full
