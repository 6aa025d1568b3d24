"""Encryption of project secrets at rest (docs/variables.md "Secrets at rest")."""

from __future__ import annotations

from typing import Protocol


class SecretBox(Protocol):
    """Seals and opens short texts with a key the database never holds.

    ``context`` binds a sealed text to where it is stored (the project and the variable name): a sealed
    value copied to another row does not open there.
    """

    def seal(self, plaintext: str, context: str) -> str:
        """An opaque printable text (a versioned prefix, then the nonce and ciphertext)."""
        ...

    def open(self, sealed: str, context: str) -> str:
        """The plaintext; raises ``SecretUnreadable`` when the key, the context or the text is wrong."""
        ...
