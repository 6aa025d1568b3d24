"""huey app: the worker runs ``huey_consumer app_huey.huey -k thread -w 2``."""

from __future__ import annotations

import os
from typing import Any

from huey import SqliteHuey
from peer_common import HUEY_DB_ENV, run_true_and_record


def make_huey(filename: str) -> tuple[SqliteHuey, Any]:
    huey = SqliteHuey(name="ql3_bench", filename=filename)

    def run_true(tag: int) -> None:
        run_true_and_record(tag)

    return huey, huey.task(name="run_true")(run_true)


# The consumer imports this module with $BENCH_HUEY_DB set; the driver calls make_huey() itself.
if HUEY_DB_ENV in os.environ:
    huey, run_true = make_huey(os.environ[HUEY_DB_ENV])
