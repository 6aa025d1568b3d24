"""Canonical JSON and domain-separated digests."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

API_TOKEN_DOMAIN = "ql3.api-token.v1"
RUN_LEASE_DOMAIN = "ql3.run-lease.v1"
CANCEL_LEASE_DOMAIN = "qinglong.cancellation-dispatch-lease.v1"
CALLBACK_DOMAIN = "ql3.callback-token.v1"
# The keyed content digest of a task revision (docs/security.md "Content digests").
TASK_CONTENT_DOMAIN = "ql3.task-revision.v2"


def canonical_json(value: Any) -> str:
    """Compact JSON in the key order of the given (ordered) dicts, without ASCII escaping."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def domain_digest(domain: str, payload: str) -> str:
    """``sha256(domain || 0x00 || payload)`` as lowercase hex."""
    return hashlib.sha256(domain.encode() + b"\x00" + payload.encode()).hexdigest()


def keyed_digest(key: bytes, domain: str, payload: str) -> str:
    """``HMAC-SHA256(key, domain || 0x00 || payload)`` as lowercase hex: without the key, nobody can
    recompute it from a guessed payload."""
    if len(key) < 32:
        raise ValueError("a digest key has at least 256 bits")
    return hmac.new(key, domain.encode() + b"\x00" + payload.encode(), hashlib.sha256).hexdigest()


def token_digest(domain: str, token: str) -> str:
    return domain_digest(domain, token)


def digest_equals(a: str, b: str) -> bool:
    """Constant-time comparison of two hex digests."""
    return hmac.compare_digest(a.encode(), b.encode())


def new_token(prefix: str = "") -> str:
    """A fresh high-entropy URL-safe token (256 bits)."""
    return prefix + secrets.token_urlsafe(32)
