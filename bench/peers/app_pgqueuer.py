"""pgqueuer factory: the worker runs ``pgq run app_pgqueuer:create_pgqueuer``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from peer_common import DSN_ENV, concurrency, run_true_and_record
from pgqueuer import Job, PgQueuer

ENTRYPOINT = "run_true"


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    conn = await psycopg.AsyncConnection.connect(os.environ[DSN_ENV], autocommit=True)
    try:
        pgq = PgQueuer.from_psycopg_connection(conn)

        # pgqueuer only accepts async entrypoints; the blocking body goes to a thread.
        @pgq.entrypoint(ENTRYPOINT, concurrency_limit=concurrency())
        async def run_true(job: Job) -> None:
            await asyncio.to_thread(run_true_and_record, int(job.payload or b"0"))

        yield pgq
    finally:
        await conn.close()


def main() -> None:
    """What `pgq run app_pgqueuer:create_pgqueuer` does, minus its logger setup.

    pgqueuer 1.6.0's `pgq run` dies in setup_fancy_logger under the typer release pip resolves
    today ('str' object has no attribute 'name'), so the worker uses the library's documented
    programmatic entry point `pgqueuer.run(factory)` (same supervisor, same defaults) instead.
    """
    import logging

    import pgqueuer

    logging.basicConfig(level=logging.WARNING)
    asyncio.run(pgqueuer.run(create_pgqueuer))


if __name__ == "__main__":
    main()
