"""A receipt published in the instant between the worker's look for it and its proof that the shim is
gone still completes the run: it is never reported lost while a trusted receipt exists."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import runs, tasks
from ql3.worker import settlement as settlement_module
from tests.support.waits import wait_for
from tests.support.worker_agent import Env


def test_a_receipt_that_appears_after_the_first_look_completes_the_run(
    env: Env,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a command that exits 4, and a first look for its receipt that comes just too early
    env.task = env.db.transaction(
        lambda tx: tasks.edit_task(tx, env.project.id, "t", {"command": "exit 4"})
    ).task
    real = settlement_module.read_receipt  # type: ignore[attr-defined]
    looks: list[str] = []

    def too_early_once(*args: Any, **kwargs: Any) -> Any:
        looks.append(args[1])
        return None if len(looks) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(settlement_module, "read_receipt", too_early_once)
    agent = env.agent()
    agent.start()
    try:
        offer = env.queue_and_claim(agent)

        # When it runs and exits
        agent.receive(offer)
        wait_for(lambda: env.run_status(offer.fence.run_id) not in ("dispatching", "running"))

        # Then the worker looked again once the shim was proven gone, and completed it with exit 4
        run = env.db.transaction(lambda tx: runs.get_run(tx, env.project.id, offer.fence.run_id))
        assert (run.status, run.exit_code, run.error_code) == ("failed", 4, "EXIT_NONZERO")
        assert len(looks) >= 2
    finally:
        agent.stop()
