"""procrastinate app: the worker runs ``procrastinate --app app_procrastinate.app worker``."""

from __future__ import annotations

import os

import procrastinate
from peer_common import DSN_ENV, run_true_and_record

TASK_NAME = "run_true"


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    # A plain (sync) task: procrastinate runs it in a thread, at most --concurrency at a time.
    @app.task(name=TASK_NAME)
    def run_true(tag: int) -> None:
        run_true_and_record(tag)

    return app


app = make_app(os.environ.get(DSN_ENV, ""))
