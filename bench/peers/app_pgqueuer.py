"""pgqueuer factory: the worker is the equivalent of ``pgq run app_pgqueuer:create_pgqueuer``.

The driver is asyncpg (pgqueuer's default: its CLI tries asyncpg first) unless
``$BENCH_PGQ_DRIVER=psycopg``. With psycopg 3 pgqueuer 1.6.0 shares one connection between the
NOTIFY watcher and the queries, and the watcher holds the connection for up to 1 s per
``notifies(timeout=1.0)`` call, which throttled the worker to ~1 job/s here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from peer_common import DSN_ENV, concurrency, run_true_and_record
from pgqueuer import Job, PgQueuer
from pgqueuer.ports.driver import Driver

ENTRYPOINT = "run_true"
DRIVER_ENV = "BENCH_PGQ_DRIVER"
DRIVERS = ("asyncpg", "psycopg")
LIMIT_ENV = "BENCH_PGQ_LIMIT"
# How the concurrency of 2 is enforced:
#   entrypoint: @entrypoint(concurrency_limit=2), counted in SQL over 'picked' rows (default batch_size 10)
#   worker:     run(batch_size=1, max_concurrent_tasks=2), this worker's 'picked' rows in SQL
#   semaphore:  no pgqueuer limit (default batch_size 10); an asyncio.Semaphore(2) around the body
LIMITS = ("entrypoint", "worker", "semaphore")


@asynccontextmanager
async def open_driver(dsn: str, driver: str) -> AsyncIterator[Driver]:
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer import AsyncpgDriver

        aconn = await asyncpg.connect(dsn=dsn, timeout=10)
        try:
            yield AsyncpgDriver(aconn)
        finally:
            await aconn.close()
    elif driver == "psycopg":
        import psycopg
        from pgqueuer import PsycopgDriver

        pconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=10)
        try:
            yield PsycopgDriver(pconn)
        finally:
            await pconn.close()
    else:
        raise ValueError(f"unknown pgqueuer driver {driver!r}, expected one of {DRIVERS}")


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    async with open_driver(os.environ[DSN_ENV], os.environ.get(DRIVER_ENV, "asyncpg")) as driver:
        pgq = PgQueuer(driver)
        limit = os.environ.get(LIMIT_ENV, "worker")
        if limit not in LIMITS:
            raise ValueError(f"unknown {LIMIT_ENV} {limit!r}, expected one of {LIMITS}")
        gate = asyncio.Semaphore(concurrency())

        # pgqueuer only accepts async entrypoints; the blocking body goes to a thread.
        @pgq.entrypoint(ENTRYPOINT, concurrency_limit=concurrency() if limit == "entrypoint" else 0)
        async def run_true(job: Job) -> None:
            if limit == "semaphore":
                async with gate:
                    await asyncio.to_thread(run_true_and_record, int(job.payload or b"0"))
            else:
                await asyncio.to_thread(run_true_and_record, int(job.payload or b"0"))

        yield pgq


def main() -> None:
    """What `pgq run app_pgqueuer:create_pgqueuer` does, minus its logger setup.

    pgqueuer 1.6.0's `pgq run` dies in setup_fancy_logger under the typer release pip resolves
    today ('str' object has no attribute 'name'), so the worker uses the library's documented
    programmatic entry point `pgqueuer.run(factory)` (same supervisor, same defaults) instead.
    """
    import logging

    import pgqueuer

    logging.basicConfig(level=logging.WARNING)
    if os.environ.get(LIMIT_ENV, "worker") == "worker":
        asyncio.run(pgqueuer.run(create_pgqueuer, batch_size=1, max_concurrent_tasks=concurrency()))
    else:
        asyncio.run(pgqueuer.run(create_pgqueuer))


if __name__ == "__main__":
    main()
