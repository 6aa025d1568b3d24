"""Completion receipts: the shim's record of a command's real exit code (docs/contracts.md §6.2).

Exact shape, at most 4 KiB, keys in this order::

    {"schemaVersion":1,"runId":..,"attemptId":..,"callbackSequence":..,"token":..,
     "startedAtMs":..,"finishedAtMs":..,"exitCode":..}

followed by one newline. The space is reserved before the command starts, so that a disk that fills
while the command runs cannot cost its exit code (docs/operations.md "A full disk"): the launcher
creates ``<receipt_dir>/<attempt_id>.json`` exclusively (``O_EXCL``, so no earlier receipt is ever
replaced) as ``RESERVED_RECEIPT_BYTES`` NUL bytes, allocated (``reserve_receipt``), and the writer
fills it in place from offset 0, without truncating or growing it, in one write with the newline last.
NUL bytes are never part of a receipt (JSON escapes them), so a reader drops the trailing NUL padding
and applies the rules to what is left: without its final newline it is the reservation still empty, a
write still in progress, or one cut short by the writer's death (a prefix of a receipt followed by
padding): readers take it for no receipt, never for a valid one and never for one to quarantine.
Anything complete that does not match the shape exactly is ``ReceiptInvalid`` and belongs in
quarantine.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ql3.domain.errors import Ql3Error
from ql3.execution.identity import InvalidHandle, ProcessHandle

SCHEMA_VERSION = 1
MAX_RECEIPT_BYTES = 4096
# The receipt file the launcher allocates before the spawn: one page, room for the largest receipt.
RESERVED_RECEIPT_BYTES = MAX_RECEIPT_BYTES
_PADDING = b"\0"
QUARANTINE_DIR = ".quarantine"
MAX_QUARANTINE_COPIES = 64
_KEYS = (
    "schemaVersion",
    "runId",
    "attemptId",
    "callbackSequence",
    "token",
    "startedAtMs",
    "finishedAtMs",
    "exitCode",
)
_KEY_SET = frozenset(_KEYS)
# Attempt ids name files here and in the log root: no separators, no leading dot, bounded length.
_FILE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_IDENTITY_RE = re.compile(rb"([A-Za-z0-9-]{1,64}) ([1-9][0-9]{0,9}) ([0-9]{1,32})\n")
_MAX_IDENTITY_BYTES = 128


class InvalidAttemptId(Ql3Error, ValueError):
    """The attempt id cannot name a local file."""

    code = "invalid_attempt_id"
    http_status = 422


class ReceiptInvalid(Ql3Error, ValueError):
    """The completion receipt is invalid and must be quarantined."""

    code = "receipt_invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(None, reason=reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Receipt:
    """A validated receipt. The raw callback token is kept out of ``repr``."""

    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str = field(repr=False)
    started_at_ms: int
    finished_at_ms: int
    exit_code: int

    def to_json(self) -> str:
        return _compact(
            {
                "schemaVersion": SCHEMA_VERSION,
                "runId": self.run_id,
                "attemptId": self.attempt_id,
                "callbackSequence": self.callback_sequence,
                "token": self.token,
                "startedAtMs": self.started_at_ms,
                "finishedAtMs": self.finished_at_ms,
                "exitCode": self.exit_code,
            }
        )


def _compact(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_file_id(attempt_id: str) -> str:
    """Return ``attempt_id`` if it is safe as a file name, else raise ``InvalidAttemptId``."""
    if not isinstance(attempt_id, str) or _FILE_ID_RE.fullmatch(attempt_id) is None:
        raise InvalidAttemptId()
    return attempt_id


def receipt_path(receipt_dir: Path, attempt_id: str) -> Path:
    return Path(_file(receipt_dir, attempt_id, ".json"))


def _file(receipt_dir: str | os.PathLike[str], attempt_id: str, suffix: str) -> str:
    """``<receipt_dir>/<attempt_id><suffix>`` as a plain string (the per-run paths: no ``Path`` parsing)."""
    return f"{os.fspath(receipt_dir)}/{check_file_id(attempt_id)}{suffix}"


def receipt_temp_path(receipt_dir: Path, attempt_id: str) -> Path:
    """The temp file of the earlier publication protocol (temp file + ``ln``): shims started by an
    earlier version may still leave one, which ``delete_receipt`` removes."""
    return receipt_dir / f".{check_file_id(attempt_id)}.tmp"


def launch_identity_path(receipt_dir: Path, attempt_id: str) -> Path:
    """Where the shim records its own identity before it starts the command (see ``read_launch_identity``)."""
    return receipt_dir / f"{check_file_id(attempt_id)}.launch"


def read_launch_identity(receipt_dir: Path, attempt_id: str) -> ProcessHandle | None:
    """The shim's self-recorded handle (``<boot id> <pid> <start ticks>``), or ``None``.

    The shim is a session leader, so its group id is its pid. The file lives in the private receipts
    directory, like the receipt itself; anything that does not parse exactly is no evidence (``None``).
    The handle still has to be proven against /proc before it is trusted with a signal.
    """
    path = launch_identity_path(receipt_dir, attempt_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = _read_at_most(fd, _MAX_IDENTITY_BYTES + 1)
    finally:
        os.close(fd)
    match = _IDENTITY_RE.fullmatch(raw)
    if match is None:
        return None
    boot, pid, ticks = (part.decode("ascii") for part in match.groups())
    try:
        return ProcessHandle(
            attempt_id=attempt_id, boot_id=boot, pid=int(pid), pgid=int(pid), start_ticks=ticks
        )
    except InvalidHandle:
        return None


def delete_launch_identity(receipt_dir: Path, attempt_id: str) -> None:
    _unlink_quietly(launch_identity_path(receipt_dir, attempt_id))


def token_digest(token: str) -> str:
    """Lowercase hex ``sha256(token)``, the form in which the callback token is persisted."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def receipt_prefix(
    *, run_id: str, attempt_id: str, callback_sequence: int, token: str, started_at_ms: int
) -> str:
    """The receipt up to and including ``"finishedAtMs":``; the shim appends the rest.

    JSON escaping happens here, in Python, so the shell never has to quote anything.
    """
    head = _compact(
        {
            "schemaVersion": SCHEMA_VERSION,
            "runId": run_id,
            "attemptId": attempt_id,
            "callbackSequence": callback_sequence,
            "token": token,
            "startedAtMs": started_at_ms,
        }
    )
    return head[:-1] + ',"finishedAtMs":'


def reserve_receipt(receipt_dir: str | os.PathLike[str], attempt_id: str) -> None:
    """Create the attempt's receipt file as ``RESERVED_RECEIPT_BYTES`` NUL bytes, allocated now.

    Exclusive (``O_EXCL``): raises ``FileExistsError`` when a file is there already (an earlier receipt
    is never replaced). The blocks are allocated with ``posix_fallocate`` where the filesystem has it,
    else written, so the shim's write into them later needs no space. Raises ``OSError`` (ENOSPC...)
    when the space cannot be had; nothing is left behind then. Reads as no receipt until filled.
    """
    path = _file(receipt_dir, attempt_id, ".json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _allocate(fd, RESERVED_RECEIPT_BYTES)
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    os.close(fd)


def _allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    # No fallocate on this filesystem: written zeros hold the blocks just as well.
    view = memoryview(bytes(size))
    offset = 0
    while offset < size:
        offset += os.pwrite(fd, view[offset:], offset)


def unreserve_receipt(receipt_dir: str | os.PathLike[str], attempt_id: str) -> None:
    """Remove the attempt's receipt file, reserved or filled (a launch that never ran its command)."""
    _unlink_quietly(_file(receipt_dir, attempt_id, ".json"))


def receipt_published(path: str | os.PathLike[str]) -> bool:
    """True when the file at ``path`` holds something complete (a receipt to read, valid or not);
    False for no file, an empty reservation or a write cut short (see the module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        raw = _read_at_most(fd, MAX_RECEIPT_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    return _published(raw) is not None


def _published(raw: bytes) -> bytes | None:
    """What a reader judges in ``raw`` (the file's first ``MAX_RECEIPT_BYTES + 1`` bytes): the bytes
    without the reservation's NUL padding, or ``None`` when they are no receipt (yet): no final newline.
    Anything longer than a receipt is returned whole, to be refused as too large."""
    if len(raw) > MAX_RECEIPT_BYTES:
        return raw
    content = raw.rstrip(_PADDING)
    return content if content.endswith(b"\n") else None


def publish_receipt(receipt_dir: Path, receipt: Receipt, *, durable: bool = False) -> bool:
    """The shim's protocol in Python: write the receipt into its reserved file in place (from offset 0,
    no truncation), the newline last; without a reservation the file is created exclusively.

    Returns False when a receipt is already published (it is never replaced). Raises ``OSError`` when
    writing fails (for example ENOSPC without a reservation); what it wrote by then lacks the final
    newline, so it reads as no receipt.
    """
    data = (receipt.to_json() + "\n").encode("utf-8")
    if len(data) > MAX_RECEIPT_BYTES:
        raise ReceiptInvalid("too_large")
    final = receipt_path(receipt_dir, receipt.attempt_id)
    if receipt_published(final):
        return False
    try:
        fd = os.open(final, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
    try:
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if durable:
        _fsync_dir(receipt_dir)
    return True


def read_receipt(
    receipt_dir: Path,
    attempt_id: str,
    *,
    expected_run_id: str,
    expected_sequence: int,
    expected_token_digest: str,
) -> Receipt | None:
    """The published receipt of one attempt, fully validated; ``None`` when none is published, which
    includes a file whose content (its NUL padding dropped) lacks the final newline: the reservation
    still empty, being written, or cut short (see the module docstring).

    Raises ``ReceiptInvalid(reason)`` (quarantine it) with a fixed reason code: ``not_regular_file``,
    ``too_large``, ``encoding``, ``json``, ``duplicate_key``, ``shape``, ``unknown_key``, ``missing_key``,
    ``schema_version``, ``type``, ``callback_sequence``, ``time_order``, ``exit_code``, ``run_id``,
    ``attempt_id``, ``token``. Raises ``OSError`` for I/O errors other than "no such file".
    """
    if not isinstance(expected_token_digest, str) or _DIGEST_RE.fullmatch(expected_token_digest) is None:
        raise ValueError("expected_token_digest must be lowercase hex sha256")
    path = _file(receipt_dir, attempt_id, ".json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReceiptInvalid("not_regular_file") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReceiptInvalid("not_regular_file")
        raw = _read_at_most(fd, MAX_RECEIPT_BYTES + 1)
    finally:
        os.close(fd)
    published = _published(raw)
    if published is None:
        return None  # not published (yet): a reservation or a prefix is never trusted nor quarantined
    receipt = parse_receipt(published)
    if receipt.run_id != expected_run_id:
        raise ReceiptInvalid("run_id")
    if receipt.attempt_id != attempt_id:
        raise ReceiptInvalid("attempt_id")
    if receipt.callback_sequence != expected_sequence:
        raise ReceiptInvalid("callback_sequence")
    if not hmac.compare_digest(token_digest(receipt.token), expected_token_digest):
        raise ReceiptInvalid("token")
    return receipt


def parse_receipt(raw: bytes) -> Receipt:
    """Validate the shape of a receipt (no expectations about ids); raises ``ReceiptInvalid``."""
    if len(raw) > MAX_RECEIPT_BYTES:
        raise ReceiptInvalid("too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReceiptInvalid("encoding") from exc
    try:
        obj = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except _DuplicateKey as exc:
        raise ReceiptInvalid("duplicate_key") from exc
    except (ValueError, RecursionError) as exc:
        raise ReceiptInvalid("json") from exc
    if type(obj) is not dict:
        raise ReceiptInvalid("shape")
    if not obj.keys() <= _KEY_SET:
        raise ReceiptInvalid("unknown_key")
    if obj.keys() != _KEY_SET:
        raise ReceiptInvalid("missing_key")
    if type(obj["schemaVersion"]) is not int or obj["schemaVersion"] != SCHEMA_VERSION:
        raise ReceiptInvalid("schema_version")
    strings = (obj["runId"], obj["attemptId"], obj["token"])
    ints = (obj["callbackSequence"], obj["startedAtMs"], obj["finishedAtMs"], obj["exitCode"])
    if any(type(s) is not str for s in strings) or any(type(i) is not int for i in ints):
        raise ReceiptInvalid("type")
    if obj["callbackSequence"] < 0:
        raise ReceiptInvalid("callback_sequence")
    if obj["startedAtMs"] < 0 or obj["finishedAtMs"] < obj["startedAtMs"]:
        raise ReceiptInvalid("time_order")
    if not 0 <= obj["exitCode"] <= 255:
        raise ReceiptInvalid("exit_code")
    return Receipt(
        run_id=obj["runId"],
        attempt_id=obj["attemptId"],
        callback_sequence=obj["callbackSequence"],
        token=obj["token"],
        started_at_ms=obj["startedAtMs"],
        finished_at_ms=obj["finishedAtMs"],
        exit_code=obj["exitCode"],
    )


def delete_receipt(receipt_dir: Path, attempt_id: str, *, legacy_temp: bool = True) -> bool:
    """Remove a consumed receipt and its launch identity; True if a receipt was there.

    ``legacy_temp`` also removes the earlier protocol's temp file (``receipt_temp_path``): only a shim
    started by an earlier version leaves one, so a worker settling the attempts it launched itself
    passes False and saves the system call.
    """
    if legacy_temp:
        _unlink_quietly(receipt_temp_path(receipt_dir, attempt_id))
    _unlink_quietly(_file(receipt_dir, attempt_id, ".launch"))
    try:
        os.unlink(_file(receipt_dir, attempt_id, ".json"))
    except FileNotFoundError:
        return False
    return True


def quarantine_receipt(receipt_dir: Path, attempt_id: str) -> Path | None:
    """Move an invalid receipt into ``.quarantine/`` (mode 0700) by hard link + unlink.

    Nothing is ever overwritten: a second invalid receipt for the same attempt gets a numbered name.
    Returns the quarantined path, or ``None`` when there was nothing to move.
    """
    source = receipt_path(receipt_dir, attempt_id)
    qdir = receipt_dir / QUARANTINE_DIR
    try:
        os.mkdir(qdir, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(qdir).st_mode):
            raise
        os.chmod(qdir, 0o700)
    for n in range(MAX_QUARANTINE_COPIES):
        target = qdir / (f"{attempt_id}.json" if n == 0 else f"{attempt_id}.{n}.json")
        try:
            os.link(source, target, follow_symlinks=False)
        except FileExistsError:
            continue
        except FileNotFoundError:
            return None
        os.unlink(source)
        _unlink_quietly(receipt_temp_path(receipt_dir, attempt_id))
        return target
    raise FileExistsError(errno.EEXIST, "quarantine slots exhausted")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey()
        out[key] = value
    return out


def _reject_constant(_: str) -> Any:
    raise ValueError("non-finite number")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, limit - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _unlink_quietly(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
