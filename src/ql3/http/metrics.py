"""``GET /metrics``: Prometheus text format, counts by status and loop health. No ids as labels."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ql3.application import metrics
from ql3.ports.storage import Database


class _Ql3Collector(Collector):
    def __init__(self, db: Database, loops: Sequence[Any]) -> None:
        self._db = db
        self._loops = loops

    def collect(self) -> Iterator[Any]:
        counts = self._db.transaction(metrics.status_counts, write=False)
        for family, by_status in counts.items():
            gauge = GaugeMetricFamily(
                f"ql3_{family}", f"{family.replace('_', ' ')} by status", labels=["status"]
            )
            for status, n in sorted(by_status.items()):
                gauge.add_metric([status], n)
            yield gauge
        cycles = CounterMetricFamily("ql3_loop_cycles", "cycles run by each control loop", labels=["loop"])
        failures = GaugeMetricFamily(
            "ql3_loop_recent_failures", "failed cycles among the last 32 recorded", labels=["loop"]
        )
        for loop in self._loops:
            cycles.add_metric([loop.name], loop.cycles)
            failures.add_metric([loop.name], len(loop.diagnostics))
        yield cycles
        yield failures


def install(app: FastAPI, db: Database, loops: Sequence[Any]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Ql3Collector(db, loops))

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics_endpoint() -> Response:
        """Prometheus metrics: counts by status and control-loop health (no authentication)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
