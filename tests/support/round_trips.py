"""Counting client/server round trips on PostgreSQL as psycopg makes them; shared by the round-trip
budget test (tests/contract/test_pg_round_trips.py) and the benchmark (bench/ql3_bench.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg._pipeline_base import BasePipeline


@contextlib.contextmanager
def count_round_trips() -> Iterator[list[int]]:
    """Count client/server round trips on PostgreSQL as psycopg makes them: outside a pipeline every
    exchange (statement, BEGIN/COMMIT, pool check) is one ``Connection.wait`` whose generator does
    I/O (the pool's commit of an idle connection does none); inside a pipeline the queued statements
    travel together and one round trip is one Sync."""
    counter = [0]
    wait, sync = psycopg.Connection.wait, BasePipeline._enqueue_sync

    def counted_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if self._pipeline is not None:
            return wait(self, gen, *args, **kwargs)

        def io(gen: Any = gen) -> Any:
            first = True
            try:
                state = next(gen)
                while True:
                    if first:
                        counter[0] += 1
                        first = False
                    state = gen.send((yield state))
            except StopIteration as stop:
                return stop.value

        return wait(self, io(), *args, **kwargs)

    def counted_sync(self: Any) -> None:
        counter[0] += 1
        sync(self)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]
    BasePipeline._enqueue_sync = counted_sync  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        psycopg.Connection.wait = wait  # type: ignore[method-assign]
        BasePipeline._enqueue_sync = sync  # type: ignore[method-assign]
