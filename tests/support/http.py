"""HTTP helpers for tests that talk to the API."""

from __future__ import annotations


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header for ``token``."""
    return {"Authorization": f"Bearer {token}"}
