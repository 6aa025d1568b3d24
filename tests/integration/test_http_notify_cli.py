"""``ql3 notify`` and ``ql3 project retention`` in-process against the app."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application.notifications import NotificationDeliverer
from ql3.domain.notifications import ChannelTarget, Message
from ql3.storage.sqlite.adapter import SqliteDatabase

URL = "tgram://123456:planted-cli-bot-token/42"


class Recorder:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, channel: ChannelTarget, message: Message) -> None:
        self.sent.append(message)


def test_channel_add_list_remove_never_echo_the_url(cli_main: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_URL", URL)

    code, out, err = cli_main("notify", "channel", "add", "phone", "--apprise-env", "TG_URL")
    assert code == 0 and "phone" in out

    code, out, _ = cli_main("notify", "channel", "list")
    assert code == 0 and "phone" in out and "tgram" in out
    code, json_out, _ = cli_main("--json", "notify", "channel", "list")
    assert "planted-cli-bot-token" not in out + json_out + err

    assert cli_main("notify", "channel", "remove", "phone")[0] == 0
    assert "phone" not in cli_main("notify", "channel", "list")[1]


def test_a_generated_webhook_secret_is_printed_once(cli_main: Any) -> None:
    code, out, err = cli_main("notify", "channel", "add", "ops", "--webhook", "https://example.invalid/h")

    assert code == 0 and "shown only once" in err
    secret = out.strip().splitlines()[-1]
    assert len(secret) >= 32
    assert secret not in cli_main("--json", "notify", "channel", "list")[1]


def test_usage_errors_exit_64(cli_main: Any) -> None:
    assert cli_main("notify", "channel", "add", "x")[0] == 64
    assert cli_main("notify", "channel", "add", "x", "--apprise-env", "QL3_SURELY_UNSET_VAR")[0] == 64
    assert (
        cli_main("notify", "channel", "add", "x", "--webhook", "ftp://nope", "--secret-env", "HOME")[0] == 64
    )
    assert cli_main("project", "retention", "set", "--days", "0")[0] == 64


def test_rules_from_the_cli(cli_main: Any, make_task: Any) -> None:
    make_task("backup")
    cli_main("notify", "channel", "add", "ops", "--webhook", "https://example.invalid/h")

    code, out, _ = cli_main(
        "notify", "rule", "add", "--channel", "ops", "--task", "backup", "--events", "failed,succeeded"
    )
    assert code == 0 and "failed,succeeded of task backup -> ops" in out
    code, out, _ = cli_main("notify", "rule", "list")
    assert "backup" in out and "failed,succeeded" in out
    assert cli_main("notify", "rule", "add", "--channel", "ops", "--events", "boom")[0] == 64


def test_notify_test_waits_for_the_delivery(cli_main: Any, db: SqliteDatabase) -> None:
    cli_main("notify", "channel", "add", "ops", "--webhook", "https://example.invalid/h")
    recorder = Recorder()
    deliverer = NotificationDeliverer(db, recorder, "test-loop")
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            deliverer.deliver_batch()
            stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        code, out, err = cli_main("notify", "test", "ops", "--timeout", "60")
    finally:
        stop.set()
        thread.join(5)

    assert code == 0, err
    assert "delivered" in out
    assert [m.event for m in recorder.sent] == ["test"]


def test_notify_test_reports_an_undelivered_message(cli_main: Any) -> None:
    cli_main("notify", "channel", "add", "ops", "--webhook", "https://example.invalid/h")

    code, _, err = cli_main("notify", "test", "ops", "--timeout", "0.3")

    assert code == 1 and "notification_not_delivered" in err and "pending" in err


def test_retention_set_and_show(cli_main: Any) -> None:
    code, out, _ = cli_main("project", "retention", "set", "--days", "30", "--runs-per-task", "1000")
    assert code == 0 and "30" in out and "1000" in out
    code, out, _ = cli_main("--json", "project", "retention", "show")
    assert '"keep_days": 30' in out and '"log_bytes_per_run": null' in out
