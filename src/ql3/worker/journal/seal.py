"""The sealed lease token: encrypt-then-MAC under a worker-local key, so the journal file alone
(a copy, a backup, a leaked WAL) holds no usable secret (docs/security.md)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import Final

from ql3.domain.journal import JournalInvalid, JournalUnavailable
from ql3.worker.journal.files import fsync_dir
from ql3.worker.journal.validation import MAX_LEASE_TOKEN_BYTES

KEY_BYTES: Final = 32

_SEAL_VERSION: Final = "s1"
_SEAL_DOMAIN: Final = b"ql3-journal-lease-token-seal-v1\0"


class TokenSeal:
    """Encrypt-then-MAC of a lease token under the worker-local key, bound to its offer id.

    The keystream is HMAC-SHA256(key, domain | "stream" | offer id | block counter), XORed with the
    token; the tag is HMAC-SHA256(key, domain | "tag" | offer id | ciphertext). An offer id always
    carries the same lease (and so the same token): a keystream is never used for two plaintexts.
    Standard library only (``hmac``, ``hashlib``).
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise JournalUnavailable(reason="key_invalid")
        self._key = key

    def __repr__(self) -> str:
        return "TokenSeal(<key>)"

    @classmethod
    def load(cls, path: Path) -> TokenSeal:
        """Read the key at ``path``, creating it (``0600``, written then linked into place) if missing."""
        try:
            return cls(_read_key(path))
        except FileNotFoundError:
            pass
        tmp = path.with_name(path.name + ".tmp")
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()  # a crash before the link below left it
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, os.urandom(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # never replaces a key that another opener linked first
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            fsync_dir(path.parent)
            return cls(_read_key(path))
        except OSError as exc:
            raise JournalUnavailable(reason="key_unavailable") from exc

    def seal(self, offer_id: str, token: str) -> str:
        plain = token.encode()
        if not plain or len(plain) > MAX_LEASE_TOKEN_BYTES:
            raise JournalInvalid(reason="lease_token_invalid")
        cipher = bytes(a ^ b for a, b in zip(plain, self._stream(offer_id, len(plain)), strict=True))
        tag = self._tag(offer_id, cipher)
        return f"{_SEAL_VERSION}.{_b64(cipher)}.{_b64(tag)}"

    def unseal(self, offer_id: str, sealed: str) -> str:
        """The token, or ``JournalUnavailable(reason="seal_invalid")`` for a wrong key or a tampered seal."""
        try:
            version, cipher_text, tag_text = sealed.split(".")
            cipher, tag = _unb64(cipher_text), _unb64(tag_text)
        except ValueError:
            raise JournalUnavailable(reason="seal_invalid") from None
        if version != _SEAL_VERSION or not hmac.compare_digest(tag, self._tag(offer_id, cipher)):
            raise JournalUnavailable(reason="seal_invalid")
        plain = bytes(a ^ b for a, b in zip(cipher, self._stream(offer_id, len(cipher)), strict=True))
        try:
            return plain.decode()
        except UnicodeDecodeError:
            raise JournalUnavailable(reason="seal_invalid") from None

    def _stream(self, offer_id: str, length: int) -> bytes:
        prefix = _SEAL_DOMAIN + b"stream\0" + offer_id.encode() + b"\0"
        blocks = (length + 31) // 32
        stream = b"".join(
            hmac.new(self._key, prefix + i.to_bytes(4, "big"), hashlib.sha256).digest() for i in range(blocks)
        )
        return stream[:length]

    def _tag(self, offer_id: str, cipher: bytes) -> bytes:
        message = _SEAL_DOMAIN + b"tag\0" + offer_id.encode() + b"\0" + cipher
        return hmac.new(self._key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != KEY_BYTES:
            raise JournalUnavailable(reason="key_invalid")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
        return os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)


def key_path_for(journal_path: Path) -> Path:
    """Where the journal's sealing key lives: ``journal.db`` -> ``journal.key``, beside it."""
    key = journal_path.with_suffix(".key")
    return key if key != journal_path else journal_path.with_name(journal_path.name + ".key")
