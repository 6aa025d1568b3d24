"""``from notify import send``: a message from a running ql3 task to its project's channels.

QingLong's ``notify.py`` call, ``send(title, content)``, backed by ql3's outbox: the message goes to
the channels whose rules take ``script`` messages (docs/notifications.md "From a script"). Standard
library only, so any Python 3.8+ a task runs can import it. The credential is the run's own
``$QL3_NOTIFY_TOKEN``, valid while the run runs; the server is ``$QL3_NOTIFY_URL``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["NotifyError", "send"]

RETRY_FOR_S = 15.0  # a run starts before its credential is accepted: 409 attempt_not_running
TIMEOUT_S = 10.0


class NotifyError(RuntimeError):
    """The message was not accepted; ``code`` is the server's error code (or ``unreachable``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message


def send(title: str, content: str = "", log_lines: int = 0, **_ignored: Any) -> dict[str, Any]:
    """Queue ``title`` and ``content`` (and the run's last ``log_lines`` lines of output, 0-50, secrets
    masked) for the project's channels; returns the server's answer (``run_id``, ``deliveries``).
    Raises ``NotifyError`` when it is refused."""
    url = os.environ.get("QL3_NOTIFY_URL")
    token = os.environ.get("QL3_NOTIFY_TOKEN")
    if not url or not token:
        raise NotifyError("not_in_a_run", "QL3_NOTIFY_URL and QL3_NOTIFY_TOKEN are set only inside a ql3 run")
    data = json.dumps({"title": title, "body": content, "log_lines": log_lines}).encode()
    deadline = time.monotonic() + RETRY_FOR_S
    delay = 0.1
    while True:
        request = urllib.request.Request(
            url.rstrip("/") + "/api/v1/notify",
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                result: dict[str, Any] = json.loads(answer.read())
                return result
        except urllib.error.HTTPError as exc:
            error = _error(exc)
            if error[0] != "attempt_not_running" or time.monotonic() >= deadline:
                raise NotifyError(*error) from None
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() >= deadline:
                raise NotifyError("unreachable", str(exc)) from None
        time.sleep(delay)
        delay = min(1.0, delay * 2)


def _error(exc: urllib.error.HTTPError) -> tuple[str, str]:
    try:
        body = json.loads(exc.read())["error"]
        return str(body["code"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        return f"http_{exc.code}", exc.reason or ""
