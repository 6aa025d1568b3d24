"""The log-files port used by retention and by the notifications' log excerpts: per-attempt log files,
addressed by attempt id (or log artifact id) only."""

from __future__ import annotations

from typing import Protocol


class LogFiles(Protocol):
    """The per-attempt log files of one worker host (the embedded worker's logs directory)."""

    def remove(self, attempt_id: str) -> int:
        """Delete the attempt's log file if it exists; returns the bytes freed (0 when absent).
        Never follows a link; an id that is not a safe file name frees nothing."""
        ...

    def cap(self, attempt_id: str, max_bytes: int) -> int:
        """Cut the log to its first ``max_bytes`` plus a truncation marker when it is larger;
        returns the bytes freed (0 when it was within the cap or absent)."""
        ...

    def tail(self, attempt_id: str, max_bytes: int) -> tuple[bytes, bool]:
        """The last ``max_bytes`` of the log and whether that is the whole log (empty and whole when
        it is absent). Never follows a link; an id that is not a safe file name reads as absent."""
        ...
