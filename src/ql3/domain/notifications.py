"""Notification rules: which outcomes notify, channel validation, message shape, signing and backoff.

Pure rules; the outbox, its delivery loop and the senders live in application and adapters
(docs/notifications.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from ql3.domain.digests import domain_digest, sha256_hex
from ql3.domain.errors import Ql3Error, ValidationFailed

ChannelKind = Literal["webhook", "apprise"]
CHANNEL_KINDS: Final = ("webhook", "apprise")
# An outbox row: waiting (``pending``, due at ``due_at_ms``), claimed by a deliverer (``leased``), or
# settled for good (``delivered``, or ``dead`` after its last attempt).
DeliveryStatus = Literal["pending", "leased", "delivered", "dead"]
DELIVERY_STATUSES: Final[tuple[DeliveryStatus, ...]] = ("pending", "leased", "delivered", "dead")
# Outcomes that can notify. ``succeeded`` is opt-in; the rest are the default set of a new rule.
EVENTS: Final = (
    "failed",
    "timed_out",
    "lost",
    "cancellation_blocked",
    "approval_requested",
    "succeeded",
    "script",
    "cron_late",
    "test",
)
RULE_EVENTS: Final = frozenset(EVENTS) - {"test"}
# ``script``: a message a running task sends itself (``ql3 notify TITLE BODY``, notify.py, sendNotify).
DEFAULT_EVENTS: Final = (
    "approval_requested",
    "cancellation_blocked",
    "cron_late",
    "failed",
    "lost",
    "script",
    "timed_out",
)
RUN_STATUS_EVENTS: Final = frozenset({"failed", "timed_out", "lost", "succeeded"})
# Events about one run: delivered with a console link to it when the server knows its URL.
RUN_EVENTS: Final = frozenset(
    {"failed", "timed_out", "lost", "succeeded", "cancellation_blocked", "cron_late"}
)
# Outcomes delivered with the run's last log lines too (docs/notifications.md "Log excerpt and link").
EXCERPT_EVENTS: Final = frozenset({"failed", "timed_out", "lost"})
OUTCOME_LOG_LINES: Final = 20
MAX_CHANNELS_PER_PROJECT: Final = 32
MAX_RULES_PER_PROJECT: Final = 64
MAX_TARGET_BYTES: Final = 2048
MIN_SECRET_CHARS: Final = 16
MAX_SECRET_CHARS: Final = 256
SIGNATURE_HEADER: Final = "X-Ql3-Signature"
DELIVERY_HEADER: Final = "X-Ql3-Delivery"
EVENT_HEADER: Final = "X-Ql3-Event"
_SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]{0,31}$")
_ERROR_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class DeliveryFailed(Ql3Error):
    """The notification could not be delivered."""

    code = "notification_delivery_failed"
    http_status = 502
    retryable = True

    def __init__(self, reason: str) -> None:
        # ``reason`` is a short code (``http_500``, ``timeout``...): never a URL or a response body.
        super().__init__(reason=reason if _ERROR_RE.fullmatch(reason) else "delivery_error")
        self.reason = str(self.details["reason"])


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelTarget:
    """What a sender needs: held only by the delivery loop, never returned by an API."""

    id: str
    kind: ChannelKind
    target: str
    secret: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One notification as delivered: an id receivers can deduplicate on, a title, a JSON body."""

    delivery_id: str
    event: str
    title: str
    body: dict[str, Any]

    def json_bytes(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":"), sort_keys=True).encode()

    def text(self) -> str:
        facts = [
            f"{k}: {v}"
            for k, v in sorted(self.body.items())
            if v is not None and k not in ("title", "message", "log")
        ]
        message, log = self.body.get("message"), self.body.get("log")
        lines = [message, "", *facts] if isinstance(message, str) and message else facts
        return "\n".join([*lines, "", log] if isinstance(log, str) and log else lines)


def validate_channel(kind: str, target: str, secret: str | None) -> tuple[ChannelKind, str]:
    """Check a channel's kind, target URL and secret; return the kind and the URL scheme (showable)."""
    if kind not in CHANNEL_KINDS:
        raise ValidationFailed("invalid channel kind", field="kind", allowed=list(CHANNEL_KINDS))
    if not isinstance(target, str) or not target or len(target.encode()) > MAX_TARGET_BYTES:
        raise ValidationFailed("invalid channel url", field="url")
    if any(ord(c) < 0x21 for c in target):
        raise ValidationFailed("invalid channel url", field="url")
    scheme = target.split("://", 1)[0].lower() if "://" in target else ""
    if not _SCHEME_RE.fullmatch(scheme):
        raise ValidationFailed("the channel url needs a scheme (https://, tgram://...)", field="url")
    if kind == "webhook":
        parts = urlsplit(target)
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValidationFailed("a webhook url is http:// or https:// with a host", field="url")
        if secret is None or not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS or not secret.isascii():
            raise ValidationFailed(
                f"a webhook needs a secret of {MIN_SECRET_CHARS}-{MAX_SECRET_CHARS} ASCII characters",
                field="secret",
            )
        return "webhook", scheme
    if secret is not None:
        raise ValidationFailed("only a webhook takes a secret (apprise urls carry their own)", field="secret")
    return "apprise", scheme


def validate_events(events: list[str] | None) -> str:
    """A rule's events as a sorted comma-separated set (the stored form); None means the defaults."""
    chosen = list(DEFAULT_EVENTS) if events is None else events
    if not chosen or any(e not in RULE_EVENTS for e in chosen) or len(chosen) > len(RULE_EVENTS):
        raise ValidationFailed("invalid events", field="events", allowed=sorted(RULE_EVENTS))
    return ",".join(sorted(set(chosen)))


def rule_matches(events_csv: str, rule_task_id: str, event: str, task_id: str | None) -> bool:
    """A rule fires for ``event`` when it lists it and is project-wide or names this task."""
    return event in events_csv.split(",") and (rule_task_id == "" or rule_task_id == task_id)


def signature(secret: str, body: bytes) -> str:
    """The webhook signature header value: ``sha256=<hex HMAC-SHA256 of the raw body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_ms(attempts: int, base_ms: int, max_ms: int) -> int:
    """Exponential backoff after the ``attempts``-th failed delivery (1-based), capped."""
    return int(min(max_ms, base_ms * 2 ** max(0, min(attempts - 1, 30))))


def title_for(event: str, project: str, task: str | None, script_title: object = None) -> str:
    subject = f"{project}/{task}" if task else project
    if event == "script":
        return f"{subject}: {script_title}" if isinstance(script_title, str) and script_title else subject
    return {
        "failed": f"ql3: {subject} failed",
        "timed_out": f"ql3: {subject} timed out",
        "lost": f"ql3: {subject} lost its worker",
        "succeeded": f"ql3: {subject} succeeded",
        "cancellation_blocked": f"ql3: cancelling a run of {subject} is blocked",
        "approval_requested": f"ql3: {subject} waits for an approval",
        "cron_late": f"ql3: a cron run of {subject} is still waiting for a slot",
        "test": f"ql3: test notification for {subject}",
    }[event]


# -- messages a running task sends (``script``) --------------------------------------------------------

NOTIFY_TOKEN_PREFIX: Final = "ql3r_"
MAX_SCRIPT_TITLE_CHARS: Final = 200
MAX_SCRIPT_BODY_CHARS: Final = 2000
MAX_SCRIPT_MESSAGES_PER_ATTEMPT: Final = 20
MAX_PAYLOAD_CHARS: Final = 4000  # the outbox keeps at most 4096 characters of JSON per message
_TOKEN_RE = re.compile(r"^ql3r_([A-Za-z0-9-]{1,64})\.([A-Za-z0-9_-]{32,128})$")


NOTIFY_SECRET_DOMAIN: Final = "ql3.notify-credential.v1"


def notify_secret(callback_token_digest: str) -> str:
    """The secret half of a run's notify credential: derived one way from the digest of the attempt's
    callback token (which the server stores at the running ACK), so the task never holds the callback
    token itself and the credential cannot complete or report anything."""
    return domain_digest(NOTIFY_SECRET_DOMAIN, callback_token_digest)


def notify_token(attempt_id: str, callback_token: str) -> str:
    """The credential a running attempt sends messages with: its attempt id and a secret derived from
    its callback token, valid while the attempt runs (docs/notifications.md "From a script")."""
    return f"{NOTIFY_TOKEN_PREFIX}{attempt_id}.{notify_secret(sha256_hex(callback_token))}"


def parse_notify_token(value: str | None) -> tuple[str, str] | None:
    """``(attempt_id, callback_token)`` of a well-formed credential, else None."""
    found = _TOKEN_RE.match(value or "")
    return None if found is None else (found.group(1), found.group(2))


def script_text(title: object, body: object) -> tuple[str, str]:
    """Validate a script's title and body: printable text (newlines and tabs allowed in the body)."""
    if not isinstance(title, str) or not 1 <= len(title) <= MAX_SCRIPT_TITLE_CHARS or not title.isprintable():
        raise ValidationFailed(
            f"the title is 1-{MAX_SCRIPT_TITLE_CHARS} printable characters on one line",
            field="title",
            limit=MAX_SCRIPT_TITLE_CHARS,
        )
    if not isinstance(body, str) or len(body) > MAX_SCRIPT_BODY_CHARS:
        raise ValidationFailed(
            f"the body is at most {MAX_SCRIPT_BODY_CHARS} characters",
            field="body",
            limit=MAX_SCRIPT_BODY_CHARS,
        )
    if any(not (c.isprintable() or c in "\n\t") for c in body):
        raise ValidationFailed("the body has control characters", field="body")
    return title, body


def run_link(console_url: str, run_id: str) -> str:
    """The console page of a run on the server at ``console_url``."""
    return f"{console_url.rstrip('/')}/#/runs/{run_id}"


def fit_payload(facts: dict[str, Any], key: str, *, keep_end: bool = False) -> dict[str, Any]:
    """Shorten ``facts[key]`` (marked with an ellipsis) until the JSON form fits the outbox's cap;
    ``keep_end``: drop its start instead of its end (a log excerpt keeps its newest lines)."""
    text = str(facts[key])
    fitted = dict(facts)
    while len(json.dumps(fitted, separators=(",", ":"), sort_keys=True)) > MAX_PAYLOAD_CHARS and text:
        if keep_end:
            text = text[len(text) - len(text) * 3 // 4 :]
            fitted[key] = "\u2026" + text
        else:
            text = text[: len(text) * 3 // 4]
            fitted[key] = text + "\u2026"
    return fitted


MAX_LOG_LINES: Final = 50
MAX_LOG_EXCERPT_CHARS: Final = 1500
LOG_TAIL_BYTES: Final = 16 * 1024  # read at most this much of the end of a log for an excerpt
MASK: Final = "***"
MIN_MASKED_CHARS: Final = 4  # shorter values would mask ordinary words


def log_excerpt(tail: bytes, lines: int, secrets: list[str], *, whole: bool) -> str:
    """The last ``lines`` lines of a log's ``tail`` (``whole``: the tail is the whole log, so its first
    line is complete), every secret value masked, at most ``MAX_LOG_EXCERPT_CHARS`` characters (the
    newest kept)."""
    text = tail.decode("utf-8", errors="replace")
    if not whole:
        text = text.partition("\n")[2]  # the first line was cut by the read
    for secret in sorted({s for s in secrets if len(s) >= MIN_MASKED_CHARS}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    kept = text.rstrip("\n").split("\n")[-lines:] if lines > 0 and text.strip() else []
    excerpt = "\n".join(kept)
    return excerpt[-MAX_LOG_EXCERPT_CHARS:]
