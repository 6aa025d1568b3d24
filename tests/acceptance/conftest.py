"""Fixtures local to the acceptance tests: a server per test or per module, and spawned CLIs reaped.

The helpers themselves (``start_server``, ``run_cli``, ``stop``...) are in ``tests/support/server.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import Server, reap_spawned, start_server, stop


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Server]:
    """A server of its own for one test."""
    server = start_server(tmp_path / "home")
    try:
        yield server
    finally:
        stop(server.process)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a module whose tests use distinct task names."""
    server = start_server(tmp_path_factory.mktemp("acceptance") / "home")
    try:
        yield server
    finally:
        stop(server.process)


@pytest.fixture(autouse=True)
def _reap_spawned() -> Iterator[None]:
    yield
    reap_spawned()
