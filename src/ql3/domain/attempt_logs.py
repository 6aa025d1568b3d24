"""A shipped attempt log (docs/cluster.md "Log shipping"): its head record and what readers see
after the stored bytes of a log that reached its quota."""

from __future__ import annotations

from dataclasses import dataclass


def truncation_marker(cap_bytes: int) -> bytes:
    """What readers see after the first ``cap_bytes`` bytes: the same text as a capped local log."""
    return f"\n[ql3: log truncated at {cap_bytes} bytes]\n".encode("ascii")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogHead:
    attempt_id: str
    stored_bytes: int
    cap_bytes: int
    truncated: bool
    closed: bool

    @property
    def length(self) -> int:
        """The length readers see: the stored bytes, then the marker when truncated."""
        return self.stored_bytes + (len(truncation_marker(self.cap_bytes)) if self.truncated else 0)
