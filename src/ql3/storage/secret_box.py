"""AES-256-GCM sealing of project secrets (ports/secrets.py) with a key file in ``$QL3_HOME``.

The key (32 random bytes, ``variables.key``, mode 0600) never enters the database, so a database
dump or backup alone does not reveal a secret. Each value gets a fresh 96-bit nonce; the project and
variable name are the associated data, so a sealed value moved to another row does not open.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ql3.domain.errors import SecretUnreadable

PREFIX: Final = "aesgcm1:"
KEY_FILE: Final = "variables.key"
NONCE_BYTES: Final = 12


class AesGcmBox:
    """``SecretBox`` over one 256-bit key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the secrets key is 32 bytes")
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return "AesGcmBox(<key>)"

    def seal(self, plaintext: str, context: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), context.encode())
        return PREFIX + base64.b64encode(nonce + sealed).decode()

    def open(self, sealed: str, context: str) -> str:
        if not sealed.startswith(PREFIX):
            raise SecretUnreadable()
        try:
            raw = base64.b64decode(sealed[len(PREFIX) :], validate=True)
            return self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], context.encode()).decode()
        except (InvalidTag, ValueError) as exc:
            raise SecretUnreadable() from exc


def load_or_create_key(home: Path) -> bytes:
    """``$QL3_HOME/variables.key``: read, or created once with mode 0600 (O_EXCL: two first starts
    cannot write two keys)."""
    path = home / KEY_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_bytes()
        try:
            os.write(fd, os.urandom(32))
            os.fsync(fd)
        finally:
            os.close(fd)
        data = path.read_bytes()
    if len(data) != 32:
        raise SecretUnreadable(f"{path} is not a 32-byte key")
    return data
