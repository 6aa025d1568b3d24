"""``GET /metrics``: Prometheus text format, counts by status and loop health. No ids as labels.

prometheus-client is imported on the first scrape, so a server nobody scrapes does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Response

from ql3.application import metrics, workers
from ql3.ports.storage import Database


def _registry(db: Database, loops: Sequence[Any]) -> Any:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class Ql3Collector(Collector):
        def collect(self) -> Iterator[Any]:
            counts = db.transaction(metrics.status_counts, write=False)
            for family, by_status in counts.items():
                gauge = GaugeMetricFamily(
                    f"ql3_{family}", f"{family.replace('_', ' ')} by status", labels=["status"]
                )
                for status, n in sorted(by_status.items()):
                    gauge.add_metric([status], n)
                yield gauge
            waiting = GaugeMetricFamily(
                "ql3_runs_queued_by_reason", "queued runs by waiting reason", labels=["reason"]
            )
            for reason, n in db.transaction(workers.queued_by_reason, write=False).items():
                waiting.add_metric([reason], n)
            yield waiting
            cycles = CounterMetricFamily(
                "ql3_loop_cycles", "cycles run by each control loop", labels=["loop"]
            )
            failures = GaugeMetricFamily(
                "ql3_loop_recent_failures", "failed cycles among the last 32 recorded", labels=["loop"]
            )
            for loop in loops:
                cycles.add_metric([loop.name], loop.cycles)
                failures.add_metric([loop.name], len(loop.diagnostics))
            yield cycles
            yield failures

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Ql3Collector())
    return registry


def install(app: FastAPI, db: Database, loops: Sequence[Any]) -> None:
    built: list[Any] = []

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics_endpoint() -> Response:
        """Prometheus metrics: counts by status and control-loop health (no authentication)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if not built:
            built.append(_registry(db, loops))
        return Response(generate_latest(built[0]), media_type=CONTENT_TYPE_LATEST)
