"""The worker journal keeps only what recovery needs (issue 9 item 13): never the command, working
directory or environment values, and no row once the attempt has settled."""

from __future__ import annotations

import json
from pathlib import Path

from ql3.application import tasks
from tests.support.waits import wait_for
from tests.support.worker_agent import Env

CANARIES = ("canary-command-7f3a", "canary-env-value-91c2", "canary-cwd-d40e")


def _journal_bytes(home: Path) -> bytes:
    worker = home / "worker"
    return b"".join(p.read_bytes() for p in sorted(worker.glob("journal.db*")) if p.is_file())


def test_no_planted_secret_reaches_the_journal_and_the_settled_row_is_gone(
    env: Env,
    tmp_path: Path,
) -> None:
    # Given a task whose command, environment value and working directory each carry a canary
    cwd = tmp_path / CANARIES[2]
    cwd.mkdir()
    gate = tmp_path / "gate"
    spec = {
        "command": f"echo {CANARIES[0]} > /dev/null; while [ ! -e {gate} ]; do sleep 0.05; done",
        "env": {"DB_PASSWORD": CANARIES[1]},
        "cwd": str(cwd),
    }
    env.task = env.db.transaction(lambda tx: tasks.edit_task(tx, env.project.id, "t", spec)).task
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)
        assert all(c in offer.to_json() for c in CANARIES)  # the offer itself carries them

        # When it runs
        assert agent.receive(offer) == "started"

        # Then the journal on disk holds none of them, though it holds the attempt's row
        record = agent.journal.get(offer.offer_id)
        assert record is not None and record.state == "started"
        stored = json.loads(record.offer_json)["spec"]
        assert set(stored) <= {
            "runId",
            "attemptId",
            "projectId",
            "taskId",
            "taskRevision",
            "terminationGraceMs",
            "timeoutMs",
        }
        on_disk = _journal_bytes(env.home)
        assert on_disk and not [c for c in CANARIES if c.encode() in on_disk]
        # nor the raw lease token, which the journal keeps only sealed, and unseals for recovery
        assert offer.fence.lease_token.encode() not in on_disk
        assert record.lease_token == offer.fence.lease_token

        # And once the run completes, the row (and the sealed token in it) is gone
        gate.write_text("go")
        wait_for(lambda: env.run_status(offer.fence.run_id) == "succeeded")
        wait_for(lambda: agent.journal.get(offer.offer_id) is None)
        assert offer.fence.lease_token.encode() not in _journal_bytes(env.home)
        assert agent.journal.audit().total == 0
        assert not [c for c in CANARIES if c.encode() in _journal_bytes(env.home)]
    finally:
        agent.stop()
