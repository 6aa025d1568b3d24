"""Notification senders: a signed JSON webhook (httpx) and every apprise channel (Telegram, email,
DingTalk, WeCom, Bark...). Both libraries are imported on first send, so an idle server does not
load them. Failures become a short reason code; no URL, secret or response body leaves this module.
Every webhook (and generic apprise HTTP post) passes the egress policy first (``notify/egress.py``).
"""

from __future__ import annotations

import logging
from typing import Any, Final
from urllib.parse import urlsplit

from ql3.domain.egress import APPRISE_HOST_SCHEMES, EgressPolicy
from ql3.domain.notifications import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    ChannelTarget,
    DeliveryFailed,
    Message,
    signature,
)
from ql3.notify import egress as guard

log = logging.getLogger("ql3.notifications")
DEFAULT_TIMEOUT_S: Final = 10.0


class ChannelSender:
    """The ``NotificationSender`` of ``ql3 serve``: dispatches on the channel's kind."""

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        user_agent: str = "ql3",
        egress: EgressPolicy | None = None,
    ) -> None:
        self._egress = egress if egress is not None else EgressPolicy()
        self._timeout_s = timeout_s
        self._user_agent = user_agent
        self._apprise: Any = None

    def send(self, channel: ChannelTarget, message: Message) -> None:
        if channel.kind == "webhook":
            self._webhook(channel, message)
        elif channel.kind == "apprise":
            self._apprise_send(channel, message)
        else:
            raise DeliveryFailed("unknown_kind")

    def _webhook(self, channel: ChannelTarget, message: Message) -> None:
        import httpx

        if channel.secret is None:
            raise DeliveryFailed("missing_secret")
        try:
            parts = urlsplit(channel.target)
        except ValueError as exc:
            raise DeliveryFailed("invalid_url") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DeliveryFailed("invalid_url")
        # Connect to the address that was judged, never to a second resolution of the name; the Host
        # header and TLS (SNI and certificate check) still use the name.
        address = guard.checked_address(self._egress, parts.hostname, guard.default_port(parts))
        body = message.json_bytes()
        headers = {
            "Host": guard.host_header(parts),
            "Content-Type": "application/json",
            "User-Agent": self._user_agent,
            SIGNATURE_HEADER: signature(channel.secret, body),
            DELIVERY_HEADER: message.delivery_id,
            EVENT_HEADER: message.event,
        }
        try:
            # No proxy from the environment (trust_env): the policy judges the real target.
            with httpx.Client(timeout=self._timeout_s, follow_redirects=False, trust_env=False) as client:
                request = client.build_request(
                    "POST",
                    guard.pinned_url(parts, address),
                    content=body,
                    headers=headers,
                    extensions={"sni_hostname": parts.hostname} if parts.scheme == "https" else None,
                )
                response = client.send(request)  # a redirect is not followed: a failed delivery
        except httpx.TimeoutException as exc:
            raise DeliveryFailed("timeout") from exc
        except httpx.ConnectError as exc:
            raise DeliveryFailed("connect_error") from exc
        except httpx.HTTPError as exc:
            raise DeliveryFailed("http_error") from exc
        if not 200 <= response.status_code < 300:
            raise DeliveryFailed(f"http_{response.status_code}")

    def _apprise_send(self, channel: ChannelTarget, message: Message) -> None:
        if self._apprise is None:
            import apprise

            # apprise logs its own failures, and those lines can carry parts of a channel URL (tokens):
            # keep them out of ql3's logs; the outbox row records a reason code instead.
            logging.getLogger("apprise").setLevel(logging.CRITICAL + 1)
            self._apprise = apprise
        if channel.target.split("://", 1)[0].lower() in APPRISE_HOST_SCHEMES:
            guard.check_url(self._egress, channel.target)
        notifier = self._apprise.Apprise()
        if not notifier.add(channel.target):
            raise DeliveryFailed("invalid_url")
        try:
            ok = notifier.notify(title=message.title, body=message.text())
        except Exception as exc:  # a plugin's own bug must not kill the loop: recorded as a reason code
            log.warning(
                "apprise raised", extra={"action": "notify.apprise_error", "error": type(exc).__name__}
            )
            raise DeliveryFailed("apprise_error") from exc
        if not ok:
            raise DeliveryFailed("apprise_failed")
