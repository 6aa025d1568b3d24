"""Messages a running task sends (``ql3 notify``, notify.py, sendNotify.js): the run's own credential,
valid only while its attempt runs; the project's channels through the outbox; capped per run and in
size. Runs on SQLite and PostgreSQL (docs/notifications.md "From a script")."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pytest

from ql3.application import lease_results, notifications, variables
from ql3.application.notifications import AttemptNotRunning, NotifyCredentialInvalid, NotifyLimitReached
from ql3.application.variables import SetVariable
from ql3.domain import notifications as rules
from ql3.domain.egress import EgressPolicy
from ql3.domain.errors import ValidationFailed
from ql3.domain.offers import LeaseFence
from ql3.storage.secret_box import AesGcmBox
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, start

TOKEN = "t" * 40
SECRET = "s3cret-for-the-webhook-0123456789"


def _send(harness: Harness, credential: str | None, title: Any = "done", body: Any = "3 files") -> Any:
    return harness.db.transaction(
        lambda tx: notifications.send_from_script(tx, credential, title, body, "http://127.0.0.1:8080/")
    )


def _offered(harness: Harness, events: list[str] | None = None) -> LeaseFence:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db)
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret=SECRET,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="hook", task=None, events=events)
    )
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return offer.fence


def _outbox(harness: Harness) -> list[dict[str, Any]]:
    rows = harness.db.raw(
        "SELECT event, outcome_key, payload_json FROM notification_outbox ORDER BY created_at_ms"
    )
    return [dict(r) for r in rows]


def test_a_running_attempt_sends_to_the_project_channels_and_its_credential_ends_with_it(
    harness: Harness,
) -> None:
    fence = _offered(harness)
    credential = rules.notify_token(fence.attempt_id, TOKEN)
    # Starting: the token's digest is not stored yet: retry (the helpers do, for a few seconds).
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    with pytest.raises(AttemptNotRunning):
        _send(harness, credential)

    harness.db.transaction(
        lambda tx: lease_results.ack_running(
            tx,
            fence,
            pid=4242,
            handle="ql3lp1.test",
            log_artifact_id="a",
            callback_sequence=1,
            callback_token_digest=hashlib.sha256(TOKEN.encode()).hexdigest(),
        )
    )
    sent = _send(harness, credential, "备份完成", "3 files\n12 MB")

    assert sent.run_id == fence.run_id and sent.deliveries == 1
    (row,) = _outbox(harness)
    payload = json.loads(row["payload_json"])
    assert row["event"] == "script" and row["outcome_key"].startswith(f"script:{fence.attempt_id}:")
    assert payload["title"] == "备份完成" and payload["message"] == "3 files\n12 MB"
    assert payload["link"] == f"http://127.0.0.1:8080/#/runs/{fence.run_id}"
    assert payload["run_id"] == fence.run_id and payload["task"] == "job"
    # Another attempt's token, a malformed credential, none at all: refused, nothing written.
    for bad in (rules.notify_token(fence.attempt_id, "u" * 40), "ql3r_nope", None, TOKEN):
        with pytest.raises(NotifyCredentialInvalid):
            _send(harness, bad)
    # The attempt ends: its credential ends with it.
    harness.db.transaction(
        lambda tx: lease_results.complete(tx, fence, callback_sequence=1, callback_token=TOKEN, exit_code=0)
    )
    with pytest.raises(NotifyCredentialInvalid):
        _send(harness, credential)
    assert len(_outbox(harness)) == 1


def test_messages_are_capped_per_run_in_number_and_in_size(harness: Harness) -> None:
    fence = _offered(harness)
    start(harness.db, _offer_of(fence), token=TOKEN)
    credential = rules.notify_token(fence.attempt_id, TOKEN)

    with pytest.raises(ValidationFailed):
        _send(harness, credential, "two\nlines")
    with pytest.raises(ValidationFailed):
        _send(harness, credential, "t", "bell\x07")
    _send(harness, credential, "long", "长" * rules.MAX_SCRIPT_BODY_CHARS)
    stored = _outbox(harness)[0]["payload_json"]
    assert len(stored) <= 4096 and json.loads(stored)["message"].endswith("\u2026")
    for _ in range(rules.MAX_SCRIPT_MESSAGES_PER_ATTEMPT - 1):
        _send(harness, credential)
    with pytest.raises(NotifyLimitReached):
        _send(harness, credential)
    assert len(_outbox(harness)) == rules.MAX_SCRIPT_MESSAGES_PER_ATTEMPT


def test_only_rules_that_take_script_messages_get_them(harness: Harness) -> None:
    fence = _offered(harness, events=["failed"])
    start(harness.db, _offer_of(fence), token=TOKEN)

    sent = _send(harness, rules.notify_token(fence.attempt_id, TOKEN))

    assert sent.deliveries == 0 and _outbox(harness) == []


class _Offer:
    def __init__(self, fence: LeaseFence) -> None:
        self.fence = fence


def _offer_of(fence: LeaseFence) -> Any:
    return _Offer(fence)


def test_a_log_excerpt_keeps_the_last_lines_with_env_values_and_tokens_masked(harness: Harness) -> None:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db, env={"API_KEY": "hunter2-secret"})
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret=SECRET,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="hook", task=None, events=None)
    )
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer, token=TOKEN)
    credential = rules.notify_token(offer.fence.attempt_id, TOKEN)
    secret = credential.split(".", 1)[1]  # what a task holds: its credential, never the callback token
    log = f"cut first line\nline 1\nkey=hunter2-secret\ntoken {secret}\nline 4\n".encode()

    harness.db.transaction(
        lambda tx: notifications.send_from_script(
            tx, credential, "t", "b", None, notifications.LogTail(data=log, whole=False, lines=3)
        )
    )

    payload = json.loads(_outbox(harness)[0]["payload_json"])
    assert payload["log"] == "key=***\ntoken ***\nline 4"
    assert payload["link"] is None


def test_the_projects_secrets_are_masked_in_a_messages_text_and_excerpt(harness: Harness) -> None:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db)
    box = AesGcmBox(os.urandom(32))
    for item in (
        SetVariable(name="DB_PASS", value="pg-pass-0042", secret=True),
        SetVariable(name="PIN", value="K9z", secret=True),
        SetVariable(name="REGION", value="shanghai"),  # a plain variable is not masked
    ):
        harness.db.transaction(lambda tx, item=item: variables.set_variable(tx, project, item, box))
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret=SECRET,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="hook", task=None, events=None)
    )
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer, token=TOKEN)
    credential = rules.notify_token(offer.fence.attempt_id, TOKEN)
    log = b"login pg-pass-0042 in shanghai\npin K9z\n"

    harness.db.transaction(
        lambda tx: notifications.send_from_script(
            tx,
            credential,
            "pin K9z",
            "pass pg-pass-0042",
            None,
            notifications.LogTail(data=log, whole=True, lines=5),
            box,
        )
    )

    payload = json.loads(_outbox(harness)[0]["payload_json"])
    assert payload["log"] == "login *** in shanghai\npin ***"
    assert (payload["title"], payload["message"]) == ("pin ***", "pass ***")
