"""Durable process handles: who a process is, proven from /proc and never from a PID alone.

A handle is ``ql3lp1.`` + base64url (no padding) of the compact JSON
``{"v":1,"h":attemptId,"b":bootId,"p":pid,"g":pgid,"s":startTicks}`` (docs/contracts.md §6.1). It holds no
command, environment or working directory, and it is at most 512 bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ql3.domain.errors import Ql3Error

HANDLE_PREFIX = "ql3lp1."
MAX_HANDLE_BYTES = 512
MAX_ATTEMPT_ID_CHARS = 255
MAX_PID = 2**31 - 1
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_STAT_READ_BYTES = 4096  # a stat record is far shorter: one read
EXITED_STATES = frozenset({"Z", "X", "x"})

_BOOT_ID_RE = re.compile(r"[A-Za-z0-9-]{1,64}")
_TICKS_RE = re.compile(r"[0-9]{1,32}")
_DIGITS_RE = re.compile(r"-?[0-9]{1,20}")
_B64URL_RE = re.compile(r"[A-Za-z0-9_-]+")
_KEYS = frozenset({"v", "h", "b", "p", "g", "s"})

Verdict = Literal["match", "exited", "mismatch"]


class InvalidHandle(Ql3Error, ValueError):
    """The process handle is malformed."""

    code = "invalid_process_handle"
    http_status = 422


class CaptureFailed(Ql3Error):
    """The process identity could not be captured."""

    code = "process_capture_failed"


class ProcStatUnreadable(Ql3Error):
    """The kernel's process status record could not be parsed."""

    code = "proc_stat_unreadable"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that identify a process."""

    pid: int
    comm: str
    state: str
    pgrp: int
    start_ticks: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessHandle:
    """Boot id + pid + pgid + start ticks: a process identity that survives restarts of its caller.

    Construction validates every field and raises ``InvalidHandle``; ``encode()`` therefore never fails.
    The text is computed once, by the construction's size check, and kept (the handle is immutable).
    """

    attempt_id: str
    boot_id: str
    pid: int
    pgid: int
    start_ticks: str
    _text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _valid_fields(self.attempt_id, self.boot_id, self.pid, self.pgid, self.start_ticks):
            raise InvalidHandle()
        try:
            text = self._encode()
        except UnicodeEncodeError as exc:
            raise InvalidHandle() from exc
        if len(text) > MAX_HANDLE_BYTES:
            raise InvalidHandle()
        object.__setattr__(self, "_text", text)

    def encode(self) -> str:
        return self._text

    def _encode(self) -> str:
        payload = json.dumps(
            {
                "v": 1,
                "h": self.attempt_id,
                "b": self.boot_id,
                "p": self.pid,
                "g": self.pgid,
                "s": self.start_ticks,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")
        return HANDLE_PREFIX + base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, text: object) -> ProcessHandle:
        """Parse a handle; any deviation from the exact format raises ``InvalidHandle``."""
        if not isinstance(text, str) or len(text) > MAX_HANDLE_BYTES or not text.startswith(HANDLE_PREFIX):
            raise InvalidHandle()
        body = text[len(HANDLE_PREFIX) :]
        if not _B64URL_RE.fullmatch(body) or len(body) % 4 == 1:
            raise InvalidHandle()
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError) as exc:
            raise InvalidHandle() from exc
        try:
            obj = json.loads(
                raw.decode("utf-8"),
                object_pairs_hook=_unique_keys,
                parse_constant=_reject_constant,
                parse_float=_reject_constant,
            )
        except (ValueError, RecursionError) as exc:
            raise InvalidHandle() from exc
        if type(obj) is not dict or obj.keys() != _KEYS or type(obj["v"]) is not int or obj["v"] != 1:
            raise InvalidHandle()
        # The construction validates every field (InvalidHandle) and encodes the handle once.
        handle = cls(attempt_id=obj["h"], boot_id=obj["b"], pid=obj["p"], pgid=obj["g"], start_ticks=obj["s"])
        # One text per handle: JSON with other whitespace, key order or escapes is another spelling, and
        # so is base64 with non-zero padding bits (it re-encodes without them).
        if handle.encode() != text:
            raise InvalidHandle()
        return handle


def _valid_fields(h: object, b: object, p: object, g: object, s: object) -> bool:
    return (
        type(h) is str
        and 1 <= len(h) <= MAX_ATTEMPT_ID_CHARS
        and type(b) is str
        and _BOOT_ID_RE.fullmatch(b) is not None
        and type(p) is int
        and 0 < p <= MAX_PID
        and type(g) is int
        and 0 < g <= MAX_PID
        and type(s) is str
        and _TICKS_RE.fullmatch(s) is not None
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError("duplicate key")
        out[key] = value
    return out


def _reject_constant(_: str) -> Any:
    raise ValueError("non-integer number")


def read_boot_id() -> str:
    """The kernel's boot id, trimmed. Raises ``OSError`` when it cannot be read (e.g. not Linux)."""
    with open(BOOT_ID_PATH, encoding="ascii") as f:
        return f.read().strip()


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat``; ``None`` when no such process exists (any more).

    Raises ``ProcStatUnreadable`` for a record that does not parse, ``OSError`` for other I/O errors.
    """
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        raise ValueError("pid out of range")
    # A bare descriptor, not open(): no buffer object, no isatty/fstat/lseek calls around the read.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        raw = _read_record(fd)
    except (FileNotFoundError, ProcessLookupError):
        return None  # the process was reaped between the open and the read
    finally:
        os.close(fd)
    return parse_stat(pid, raw)


def _read_record(fd: int) -> bytes:
    """The whole record: the kernel hands it out in one read when it fits, and it ends with a newline,
    so the read that would only see the end of the file is skipped."""
    chunk = os.read(fd, _STAT_READ_BYTES)
    if not chunk or chunk.endswith(b"\n"):
        return chunk
    chunks = [chunk]
    while chunk := os.read(fd, _STAT_READ_BYTES):
        chunks.append(chunk)
    return b"".join(chunks)


def parse_stat(pid: int, raw: bytes) -> ProcStat:
    """Parse one stat record. comm may contain spaces and parentheses, hence the *last* ``)``."""
    text = raw.decode("utf-8", "surrogateescape")
    left, right = text.find("("), text.rfind(")")
    if left <= 0 or right < left:
        raise ProcStatUnreadable()
    head = text[:left].strip()
    fields = text[right + 1 :].split()
    if not head.isascii() or not head.isdigit() or int(head) != pid or len(fields) < 20:
        raise ProcStatUnreadable()
    state, pgrp, start = fields[0], fields[2], fields[19]
    if _DIGITS_RE.fullmatch(pgrp) is None or _TICKS_RE.fullmatch(start) is None:
        raise ProcStatUnreadable()
    return ProcStat(pid=pid, comm=text[left + 1 : right], state=state, pgrp=int(pgrp), start_ticks=start)


def capture(
    pid: int, attempt_id: str, *, boot_id: str | None = None, allow_zombie: bool = False
) -> ProcessHandle:
    """Capture the identity of a live process.

    ``allow_zombie`` is for the launcher: an unreaped child of ours that already exited still has a
    stable identity, and refusing it would turn a fast, successful run into a lost one.
    """
    try:
        boot = read_boot_id() if boot_id is None else boot_id
        stat = read_stat(pid)
    except (OSError, ProcStatUnreadable) as exc:
        raise CaptureFailed() from exc
    if stat is None or (stat.state in EXITED_STATES and not (allow_zombie and stat.state == "Z")):
        raise CaptureFailed()
    try:
        return ProcessHandle(
            attempt_id=attempt_id, boot_id=boot, pid=pid, pgid=stat.pgrp, start_ticks=stat.start_ticks
        )
    except InvalidHandle as exc:
        raise CaptureFailed() from exc


def classify(handle: ProcessHandle, stat: ProcStat | None, boot_id: str) -> Verdict:
    """Compare a handle with what the kernel reports now.

    ``exited`` only on proof that the handle's process is gone: another boot, no such pid, a zombie,
    or a process at that pid that started *later* than the handle's (PID reuse). A live process that
    started *earlier* than the handle claims, or the same process in another group, cannot be the
    handle's process and is no proof of exit either: ``mismatch``.
    """
    if boot_id != handle.boot_id or stat is None:
        return "exited"
    live, ours = int(stat.start_ticks), int(handle.start_ticks)
    if live != ours:
        return "exited" if live > ours else "mismatch"
    if stat.pgrp != handle.pgid:
        return "mismatch"
    if stat.state in EXITED_STATES:
        return "exited"
    return "match"


def verify_identity(handle: ProcessHandle) -> Verdict:
    """Side-effect-free identity check. Raises ``OSError``/``ProcStatUnreadable`` when /proc cannot say."""
    return classify(handle, read_stat(handle.pid), read_boot_id())


def probe(handle: ProcessHandle) -> Literal["running", "exited"]:
    """``running`` only while the exact process of the handle is alive; any difference is ``exited``."""
    return "running" if verify_identity(handle) == "match" else "exited"
