"""``GET /metrics``: Prometheus text format, counts by status and loop health. No ids as labels, and no
project-specific label values without a token (task names only for the projects a scrape token sees).

prometheus-client is imported on the first scrape, so a server nobody scrapes does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.security.utils import get_authorization_scheme_param

from ql3.application import auth, metrics, outcome_metrics, parking, schedules, workers
from ql3.application.dispatch_reasons import DispatchReasons
from ql3.application.outcome_metrics import DurationHistogram
from ql3.domain.errors import Unauthenticated
from ql3.http.auth import authenticate_caller
from ql3.http.dto import ErrorOut
from ql3.ports.storage import Database, Transaction


def _registry(db: Database, loops: Sequence[Any], reasons: DispatchReasons | None = None) -> Any:
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
            parked = GaugeMetricFamily(
                "ql3_parked_items",
                "items a control loop parked after a non-transient failure, by loop and reason",
                labels=["loop", "reason"],
            )
            for (loop_name, reason), n in sorted(db.transaction(parking.counts, write=False).items()):
                parked.add_metric([loop_name, reason], n)
            yield parked
            skipped = GaugeMetricFamily(
                "ql3_cron_skipped_occurrences",
                "cron occurrences that did not become runs, on record (100 records a task), by reason",
                labels=["reason"],
            )
            for reason, n in db.transaction(schedules.skipped_totals, write=False).items():
                skipped.add_metric([reason], n)
            yield skipped
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
            yield from _loop_health(loops)
            if reasons is not None:
                seen = CounterMetricFamily(
                    "ql3_dispatch_reasons",
                    "reasons the dispatcher gave for not placing a run or for stopping a cycle",
                    labels=["reason"],
                )
                for reason, n in reasons.totals().items():
                    seen.add_metric([reason], n)
                yield seen

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Ql3Collector())
    registry.register(_alerting_collector(db))
    return registry


def _loop_health(loops: Sequence[Any]) -> Iterator[Any]:
    """Each loop's age since its last successful cycle, and whether that age is past its bound."""
    from prometheus_client.core import GaugeMetricFamily

    age = GaugeMetricFamily(
        "ql3_loop_last_success_age_seconds",
        "seconds since the loop's last successful cycle (+Inf when its thread has ended)",
        labels=["loop"],
    )
    stuck = GaugeMetricFamily(
        "ql3_loop_stuck", "1 when the loop has had no successful cycle for too long", labels=["loop"]
    )
    failing = GaugeMetricFamily(
        "ql3_loop_consecutive_failures", "failures since the loop's last successful cycle", labels=["loop"]
    )
    for health in (loop.health() for loop in loops):
        age.add_metric([health.name], health.age_s)
        stuck.add_metric([health.name], 1.0 if health.stuck else 0.0)
        failing.add_metric([health.name], health.consecutive_failures)
    yield age
    yield stuck
    yield failing


def _alerting_collector(db: Database, histogram: DurationHistogram | None = None) -> Any:
    """Notifications by status, queue depth and the run-duration histogram: no project-specific
    label values (the per-task gauges are ``_task_families``, scoped to the caller)."""
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import Collector

    durations = histogram or DurationHistogram()

    class AlertingCollector(Collector):
        def collect(self) -> Iterator[Any]:
            def read(tx: Transaction) -> tuple[int, dict[str, int]]:
                durations.refresh(tx)
                return outcome_metrics.queue_depth(tx), outcome_metrics.notifications_by_status(tx)

            depth, outbox = db.transaction(read, write=False)
            sent = GaugeMetricFamily(
                "ql3_notifications", "notification outbox rows by status", labels=["status"]
            )
            for status, n in sorted(outbox.items()):
                sent.add_metric([status], n)
            yield sent
            yield GaugeMetricFamily("ql3_queue_depth", "runs queued and not yet placed", value=depth)
            yield HistogramMetricFamily(
                "ql3_run_duration_seconds",
                "durations of runs finished since this process's first scrape",
                buckets=durations.cumulative(),
                sum_value=durations.sum_s,
            )

    return AlertingCollector()


def _task_families(outcomes: Sequence[outcome_metrics.TaskOutcome]) -> Any:
    """The per-task gauges (task names are label values) for one scrape, in a registry of their own."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    class TaskCollector(Collector):
        def collect(self) -> Iterator[Any]:
            success = GaugeMetricFamily(
                "ql3_task_last_success_timestamp_seconds",
                "when each task last finished successfully (label values only for a scrape token)",
                labels=["task"],
            )
            failure = GaugeMetricFamily(
                "ql3_task_last_failure_timestamp_seconds",
                "when each task last failed or timed out (label values only for a scrape token)",
                labels=["task"],
            )
            for item in outcomes:
                if item.last_success_ms is not None:
                    success.add_metric([item.task], item.last_success_ms / 1000)
                if item.last_failure_ms is not None:
                    failure.add_metric([item.task], item.last_failure_ms / 1000)
            yield success
            yield failure

    registry = CollectorRegistry(auto_describe=False)
    registry.register(TaskCollector())
    return registry


def _scoped_outcomes(db: Database, token: str | None) -> list[outcome_metrics.TaskOutcome]:
    """The task outcomes this scrape may see: none without a token; with one, the tasks of the
    projects where its role allows ``metrics.read`` (every project for the owner). A token that does
    not authenticate is refused (401), as on every route."""
    if token is None:
        return []

    def read(tx: Transaction) -> list[outcome_metrics.TaskOutcome]:
        principal = authenticate_caller(tx, token)
        return outcome_metrics.task_outcomes(tx, auth.metrics_projects(tx, principal))

    return db.transaction(read, write=False)


def install(app: FastAPI, db: Database, loops: Sequence[Any], reasons: DispatchReasons | None = None) -> None:
    built: list[Any] = []

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={
            401: {"model": ErrorOut, "description": "unauthenticated: a token that does not authenticate"}
        },
    )
    def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics: counts by status and control-loop health. Without a token no
        project-specific label value appears (the per-task gauges have no samples); a token (role
        ``metrics``, a scrape token, or any role) adds the task names of its projects
        (docs/operations.md "Prometheus")."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if not built:
            built.append(_registry(db, loops, reasons))
        # Read by hand, not through the bearer dependency: the token is optional here, and the
        # document must not state that the route requires one.
        scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
        if request.headers.get("Authorization") is not None and (scheme.lower() != "bearer" or not token):
            raise Unauthenticated()
        outcomes = _scoped_outcomes(db, token or None)
        body = generate_latest(built[0]) + generate_latest(_task_families(outcomes))
        return Response(body, media_type=CONTENT_TYPE_LATEST)
