"""Killing only the shim of a running chain: the run ends lost for the true reason and no process of
its group survives (issue 9 items 5 and 6), through the worker agent and a real control plane."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ql3.application import runs, tasks
from ql3.execution.identity import ProcessHandle
from tests.support.processes import group_comms, live_group_members
from tests.support.waits import wait_for
from tests.support.worker_agent import Env

CHAIN = "sh -c 'sleep 300 & sleep 300; wait' & sleep 300 & wait"


def test_a_killed_shim_ends_the_run_lost_and_takes_its_group_along(env: Env, tmp_path: Path) -> None:
    # Given a running chain of shells and sleeps
    env.task = env.db.transaction(
        lambda tx: tasks.edit_task(tx, env.project.id, "t", {"command": CHAIN})
    ).task
    agent = env.agent()
    agent.start()
    pgid = 0
    try:
        offer = env.queue_and_claim(agent)
        assert agent.receive(offer) == "started"
        record = agent.journal.get(offer.offer_id)
        assert record is not None and record.executor_handle is not None
        handle = ProcessHandle.decode(record.executor_handle)
        pgid = handle.pgid
        wait_for(lambda: group_comms(handle.pgid).count("sleep") == 3)

        # When only the shim is SIGKILLed
        os.kill(handle.pid, signal.SIGKILL)

        # Then the run is lost for the reason the worker knows, and nothing of its group is left
        wait_for(lambda: env.run_status(offer.fence.run_id) not in ("dispatching", "running"))
        run = env.db.transaction(lambda tx: runs.get_run(tx, env.project.id, offer.fence.run_id))
        assert (run.status, run.error_code) == ("failed", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT")
        wait_for(lambda: live_group_members(handle.pgid) == [])
    finally:
        for pid in live_group_members(pgid) if pgid else []:
            os.kill(pid, signal.SIGKILL)
        agent.stop()
