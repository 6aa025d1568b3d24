"""The execution layer's fixture: ``ex``, a launcher and a running exit watcher on a temp root.

``ExecHarness`` and the /proc readers are in ``tests/support/processes.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.execution.launcher import ExitWatcher, LocalLauncher
from tests.support.processes import ExecHarness


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[ExecHarness]:
    exited: dict[str, threading.Event] = {}
    errors: list[BaseException] = []

    def on_exit(attempt_id: str) -> None:
        exited[attempt_id].set()

    watcher = ExitWatcher(on_exit, on_error=errors.append, log_check_interval_s=0.05)
    watcher.start()
    harness = ExecHarness(
        root=tmp_path, launcher=LocalLauncher(), watcher=watcher, exited=exited, errors=errors
    )
    try:
        yield harness
    finally:
        harness.kill_everything()
        watcher.stop()
    assert errors == []
