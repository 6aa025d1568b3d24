"""The notification sender port: one message to one channel, synchronously, bounded in time."""

from __future__ import annotations

from typing import Protocol

from ql3.domain.notifications import ChannelTarget, Message


class NotificationSender(Protocol):
    """Delivers messages to channels (a webhook, or an apprise URL: Telegram, email, DingTalk...)."""

    def send(self, channel: ChannelTarget, message: Message) -> None:
        """Deliver ``message`` once, within the sender's timeout. Returns when the receiver accepted it;
        raises ``DeliveryFailed`` with a short reason code (never a URL, secret or response body)
        otherwise. Never raises anything else for a delivery problem."""
        ...
