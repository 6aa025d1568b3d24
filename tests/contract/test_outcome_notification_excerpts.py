"""A run's outcome notification (``failed``, ``timed_out``, ``lost``) goes out with the console link of
the run and the last lines of its log, read from its end as the message is sent: from the log file of
the server's own worker or from the chunks a remote worker shipped, with the project's secret values
and the task's env values masked. A log that cannot be read never holds a message back. Runs on
SQLite and PostgreSQL (docs/notifications.md "Log excerpt and link")."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from ql3.application import attempt_logs, lease_results, notifications, variables
from ql3.application.notifications import NotificationDeliverer, RunExcerpts
from ql3.application.variables import SetVariable
from ql3.domain import notifications as rules
from ql3.domain.digests import sha256_hex
from ql3.domain.egress import EgressPolicy
from ql3.domain.ids import new_id
from ql3.domain.notifications import ChannelTarget, Message
from ql3.domain.offers import LeaseFence
from ql3.execution.log_retention import LogDirectory
from ql3.storage.secret_box import AesGcmBox
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register

TOKEN = "t" * 40
HOOK_SECRET = "s3cret-for-the-webhook-0123456789"
DB_PASS = "pg-pass-0042"  # a project secret
API_KEY = "hunter2-env-value"  # the task's own env value
CONSOLE = "http://ql3.example:5700/"


class RecordingSender:
    def __init__(self) -> None:
        self.sent: list[tuple[ChannelTarget, Message]] = []

    def send(self, channel: ChannelTarget, message: Message) -> None:
        self.sent.append((channel, message))


class BrokenLogs(LogDirectory):
    """A log directory whose reads fail (a disk error, a file the server may not open)."""

    def tail(self, attempt_id: str, max_bytes: int) -> tuple[bytes, bool]:
        raise PermissionError(13, "denied")


def _log_text() -> bytes:
    """30 lines; a project secret and the task's env value in the last ones."""
    lines = [f"step {i} ok" for i in range(1, 28)]
    lines += [f"connecting with password {DB_PASS}", f"header X-Key: {API_KEY}", "Traceback: boom"]
    return ("\n".join(lines) + "\n").encode()


def _running(
    harness: Harness,
    box: AesGcmBox,
    artifact: str,
    *,
    events: list[str] | None = None,
) -> tuple[LeaseFence, Any]:
    """A running attempt of a task with an env value, in a project with a secret and a webhook rule."""
    session = register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db, env={"API_KEY": API_KEY})
    harness.db.transaction(
        lambda tx: variables.set_variable(
            tx, project, SetVariable(name="DB_PASS", value=DB_PASS, secret=True), box
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret=HOOK_SECRET,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="hook", task=None, events=events)
    )
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    fence = offer.fence
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    harness.db.transaction(
        lambda tx: lease_results.ack_running(
            tx,
            fence,
            pid=4242,
            handle="ql3lp1.test",
            log_artifact_id=artifact,
            callback_sequence=1,
            callback_token_digest=sha256_hex(TOKEN),
        )
    )
    return fence, session


def _fail(harness: Harness, fence: LeaseFence, exit_code: int = 3) -> None:
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token=TOKEN, exit_code=exit_code
        )
    )


def _deliver(harness: Harness, excerpts: RunExcerpts) -> list[Message]:
    sender = RecordingSender()
    report = NotificationDeliverer(harness.db, sender, "deliverer-1", excerpts=excerpts).deliver_batch()
    assert report.delivered == len(sender.sent)
    return [message for _, message in sender.sent]


def _assert_excerpt(message: Message, run_id: str) -> None:
    body = json.loads(message.json_bytes())  # what the webhook receives (and signs)
    assert message.event == "failed" and body["run_id"] == run_id and body["attempt"] == 1
    assert body["link"] == f"http://ql3.example:5700/#/runs/{run_id}"
    expected = [f"step {i} ok" for i in range(11, 28)]
    expected += ["connecting with password ***", "header X-Key: ***", "Traceback: boom"]
    assert body["log"].split("\n") == expected  # the last 20 lines, the newest last
    raw = message.json_bytes().decode()
    assert DB_PASS not in raw and API_KEY not in raw


def test_a_failed_runs_notification_carries_its_link_and_last_lines_from_the_local_log(
    harness: Harness, tmp_path: Path
) -> None:
    box = AesGcmBox(os.urandom(32))
    artifact = new_id()
    fence, _ = _running(harness, box, artifact)
    (tmp_path / f"{artifact}.log").write_bytes(_log_text())
    _fail(harness, fence)

    (message,) = _deliver(harness, RunExcerpts(console_url=CONSOLE, logs=LogDirectory(tmp_path), box=box))

    _assert_excerpt(message, fence.run_id)
    # The excerpt is the log of the attempt the outcome is about, by its number (a retry's is not).
    excerpts = RunExcerpts(logs=LogDirectory(tmp_path), box=box)
    assert (
        harness.db.transaction(
            lambda tx: notifications.run_log_excerpt(tx, fence.run_id, excerpts, 1), write=False
        )
        == message.body["log"]
    )
    assert (
        harness.db.transaction(
            lambda tx: notifications.run_log_excerpt(tx, fence.run_id, excerpts, 2), write=False
        )
        is None
    )
    # The excerpt is added as the message is sent: the outbox row keeps the outcome's facts only.
    (row,) = harness.db.raw("SELECT payload_json, status FROM notification_outbox")
    assert row["status"] == "delivered" and "log" not in json.loads(row["payload_json"])


def test_a_remote_workers_run_gets_its_excerpt_from_the_shipped_log(harness: Harness) -> None:
    box = AesGcmBox(os.urandom(32))
    fence, session = _running(harness, box, new_id())
    data = _log_text()
    for offset in range(0, len(data), 100):  # shipped in chunks, as a worker does
        harness.db.transaction(
            lambda tx, offset=offset: attempt_logs.append(
                tx,
                worker_id=session.worker_id,
                session_id=session.session_id,
                generation=session.generation,
                attempt_id=fence.attempt_id,
                offset=offset,
                data=data[offset : offset + 100],
                final=False,
                cap_bytes=attempt_logs.DEFAULT_CAP_BYTES,
            )
        )
    _fail(harness, fence)

    # A control-plane replica: no log files of its own.
    (message,) = _deliver(harness, RunExcerpts(console_url=CONSOLE, logs=None, box=box))

    _assert_excerpt(message, fence.run_id)


def test_a_long_log_is_read_from_its_end_and_the_payload_stays_within_its_cap(
    harness: Harness, tmp_path: Path
) -> None:
    box = AesGcmBox(os.urandom(32))
    artifact = new_id()
    fence, _ = _running(harness, box, artifact)
    wide = "长" * 700  # 2,100 bytes a line: 20 of them are far more than the excerpt's cap
    (tmp_path / f"{artifact}.log").write_bytes(
        b"first line\n" + (wide + "\n").encode() * 200 + f"the end {DB_PASS}\n".encode()
    )
    _fail(harness, fence)

    (message,) = _deliver(harness, RunExcerpts(console_url=CONSOLE, logs=LogDirectory(tmp_path), box=box))

    log = message.body["log"]
    assert log.endswith("the end ***") and "first line" not in log
    assert len(log) <= rules.MAX_LOG_EXCERPT_CHARS
    assert len(message.json_bytes()) <= rules.MAX_PAYLOAD_CHARS + 100  # + the deliverer's own short facts


def test_a_log_that_cannot_be_read_never_holds_the_message_back(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = AesGcmBox(os.urandom(32))
    fence, _ = _running(harness, box, new_id())
    _fail(harness, fence)

    with caplog.at_level(logging.WARNING, logger="ql3.notifications"):
        (message,) = _deliver(harness, RunExcerpts(console_url=CONSOLE, logs=BrokenLogs(tmp_path), box=box))

    assert "log" not in message.body and message.body["link"].endswith(f"/#/runs/{fence.run_id}")
    assert [r for r in caplog.records if getattr(r, "action", None) == "notify.excerpt_unavailable"]
    (row,) = harness.db.raw("SELECT status FROM notification_outbox")
    assert row["status"] == "delivered"


def test_without_a_console_url_the_excerpt_goes_without_a_link(harness: Harness, tmp_path: Path) -> None:
    box = AesGcmBox(os.urandom(32))
    artifact = new_id()
    fence, _ = _running(harness, box, artifact)
    (tmp_path / f"{artifact}.log").write_bytes(_log_text())
    _fail(harness, fence)

    (failed,) = _deliver(harness, RunExcerpts(console_url=None, logs=LogDirectory(tmp_path), box=box))

    assert "link" not in failed.body and failed.body["log"].endswith("Traceback: boom")


def test_a_success_gets_its_link_but_no_excerpt(harness: Harness, tmp_path: Path) -> None:
    box = AesGcmBox(os.urandom(32))
    artifact = new_id()
    fence, _ = _running(harness, box, artifact, events=["failed", "succeeded"])
    (tmp_path / f"{artifact}.log").write_bytes(_log_text())
    _fail(harness, fence, exit_code=0)

    (succeeded,) = _deliver(harness, RunExcerpts(console_url=CONSOLE, logs=LogDirectory(tmp_path), box=box))

    assert succeeded.event == "succeeded" and "log" not in succeeded.body
    assert succeeded.body["link"] == f"http://ql3.example:5700/#/runs/{fence.run_id}"
