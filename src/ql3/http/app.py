"""The FastAPI app factory. The lifespan owns the long-running loops handed to it."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

import ql3
from ql3.application.disk_space import full_disks
from ql3.application.health import schema_version as applied_schema_version
from ql3.application.sessions import AddressLimiter, SessionPolicy
from ql3.console import routes as console
from ql3.domain.egress import EgressPolicy
from ql3.domain.errors import Ql3Error
from ql3.http import errors, metrics
from ql3.http.auth import DbDep
from ql3.http.dto import ErrorOut, Status
from ql3.http.limits import MAX_BODY_BYTES, BodySizeLimit, CatchAll, SecurityHeaders, StrictJson
from ql3.http.routes import actions, approvals, cancellation, lookup, projects, runs, tasks, tokens, workers
from ql3.http.routes import backup as backup_routes
from ql3.http.routes import dependencies as dependency_routes
from ql3.http.routes import notifications as notification_routes
from ql3.http.routes import parking as parking_routes
from ql3.http.routes import scripts as script_routes
from ql3.http.routes import sessions as session_routes
from ql3.http.routes import stats as stats_routes
from ql3.http.routes import subscriptions as subscription_routes
from ql3.http.routes import variables as variable_routes
from ql3.http.run_intake import StartRunFastPath
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Database
from ql3.ports.vcs import GitFetcher

log = logging.getLogger("ql3.http")


class Lifecycle(Protocol):
    """A long-running loop owned by the server: started in order, stopped in reverse."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def _stop_all(started: list[Lifecycle]) -> None:
    for component in reversed(started):
        try:
            component.stop()
        except Exception as exc:  # one failing stop must not keep the others running
            log.error(
                "lifecycle stop failed",
                extra={"action": "lifecycle.stop_failed", "error_type": type(exc).__name__},
            )


class LoopReadiness(BaseModel):
    age_s: float | None
    consecutive_failures: int
    stuck: bool


class SchemaReadiness(BaseModel):
    applied: int  # the highest migration applied to the database
    expected: int  # the last migration of this binary's chain


class Readiness(BaseModel):
    status: str
    loops: dict[str, LoopReadiness] = {}
    schema_version: SchemaReadiness | None = None


def _readiness(
    db: Database, loops: Sequence[Any], disk_paths: Sequence[Path], schema_version: int | None
) -> Readiness | JSONResponse:
    try:
        applied = db.transaction(applied_schema_version, write=False)
    except Ql3Error as exc:
        return JSONResponse(errors.error_body(exc.code, exc.message), status_code=503)
    schema = None
    if schema_version is not None:
        schema = SchemaReadiness(applied=applied, expected=schema_version)
        if applied != schema_version:
            # Behind: this binary needs migrations nobody applied. Ahead: a newer binary migrated the
            # database past what this one knows. Either way this replica must not take traffic.
            return JSONResponse(
                errors.error_body(
                    "schema_mismatch",
                    "the database schema is "
                    + ("behind" if applied < schema_version else "ahead of")
                    + " the version this server expects",
                    {"applied": applied, "expected": schema_version},
                ),
                status_code=503,
            )
    full = full_disks(disk_paths)
    if full:
        return JSONResponse(
            errors.error_body(
                "disk_full",
                "no space left where the server writes: runs cannot be recorded or logged",
                {"disks": full},
            ),
            status_code=503,
        )
    report: dict[str, LoopReadiness] = {}
    for health in (loop.health() for loop in loops):
        age = round(health.age_s, 3) if math.isfinite(health.age_s) else None
        report[health.name] = LoopReadiness(
            age_s=age, consecutive_failures=health.consecutive_failures, stuck=health.stuck
        )
    stuck = sorted(name for name, loop in report.items() if loop.stuck)
    if stuck:
        return JSONResponse(
            errors.error_body(
                "loops_stuck",
                f"control loops without a successful cycle for too long: {', '.join(stuck)}",
                {"loops": stuck},
            ),
            status_code=503,
        )
    return Readiness(status="ready", loops=report, schema_version=schema)


class Extension(Protocol):
    """Routes and state a runtime adds to the API (``ql3 control``'s worker API, docs/cluster.md)."""

    def install(self, app: FastAPI) -> None: ...


def create_app(
    db: Database,
    *,
    lifecycle: Sequence[Lifecycle] = (),
    logs_root: Path | None = None,
    extensions: Sequence[Extension] = (),
    schema_version: int | None = None,
    egress: EgressPolicy | None = None,
    secret_box: SecretBox | None = None,
    git: GitFetcher | None = None,
    session_policy: SessionPolicy | None = None,
) -> FastAPI:
    """Build the API over ``db``; ``lifecycle`` components run while the app is being served.

    ``logs_root`` is the directory of the per-attempt log files this server can read (the embedded
    worker's); without it the logs route serves only logs shipped to the database by remote workers.
    ``schema_version``: the migration this binary expects; /readyz is 503 ``schema_mismatch`` while
    the database's applied version differs (None: not checked). ``egress``: the notification egress
    policy new channels are checked against (default: nothing opened). ``secret_box`` seals project
    secrets (docs/variables.md); without one, secrets are refused (503 ``secrets_unavailable``).
    ``session_policy``: the console sessions' lifetimes and the sign-in lock-out (docs/security.md).
    """
    components = tuple(lifecycle)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started: list[Lifecycle] = []
        try:
            for component in components:
                component.start()
                started.append(component)
            yield
        finally:
            _stop_all(started)

    app = FastAPI(
        title="ql3",
        version=ql3.__version__,
        description="A durable task-execution control plane. Every `/api/v1` call needs "
        '`Authorization: Bearer <token>`; errors are `{"error": {"code", "message"}}`.',
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.db = db
    app.state.git = git  # the subscriptions' fetcher (None: syncs on demand are refused)
    app.state.logs_root = logs_root
    app.state.egress = egress if egress is not None else EgressPolicy()
    app.state.secret_box = secret_box
    policy = session_policy if session_policy is not None else SessionPolicy()
    app.state.session_policy = policy
    app.state.signin_limiter = AddressLimiter(
        max_failures=policy.address_max_failures, lockout_ms=policy.lockout_ms
    )
    errors.install(app)
    # Starlette wraps later additions around earlier ones.
    app.add_middleware(StartRunFastPath, db=db)  # innermost: inside the cap, the 500 and the headers
    app.add_middleware(StrictJson)  # in front of every route and the fast path, inside the cap
    app.add_middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(CatchAll)
    app.add_middleware(SecurityHeaders)  # outermost: also on the 413s and 500s above

    loops = [loop for component in components for loop in getattr(component, "loops", [])]
    # What the embedded dispatcher saw (application/dispatch_reasons.py): the run resource and /metrics.
    boards = [b for b in (getattr(c, "dispatch_reasons", None) for c in components) if b is not None]
    app.state.dispatch_reasons = boards[0] if boards else None
    metrics.install(app, db, loops, app.state.dispatch_reasons)
    # Where the server writes: the SQLite database's directory and the run logs.
    disk_paths = [Path(p) for p in (getattr(db, "path", None), logs_root) if p is not None]
    disk_paths = [p.parent if p.is_file() else p for p in disk_paths]

    @app.get("/healthz", response_model=Status, tags=["health"])
    def healthz() -> Status:
        """The process is up (no authentication, no database)."""
        return Status(status="ok")

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["health"],
        responses={
            503: {
                "model": ErrorOut,
                "description": "storage_unavailable, schema_mismatch, disk_full or loops_stuck",
            }
        },
    )
    def readyz(db: DbDep) -> Readiness | JSONResponse:
        """The database answers a read transaction and its schema is at the version this server
        expects (``schema_mismatch`` when it is behind or ahead), the disks it and the run logs live
        on have space left (``disk_full`` below 1 MiB free) and no control loop is stuck: each loop's
        age is the time since its last successful cycle (``null`` when its thread has ended)."""
        return _readiness(db, loops, disk_paths, schema_version)

    for router in (
        projects.router,
        tasks.router,
        tasks.schedule_router,
        runs.router,
        workers.router,
        cancellation.router,
        approvals.router,
        approvals.policy_router,
        actions.router,
        tokens.router,
        lookup.router,
        notification_routes.router,
        notification_routes.script_router,
        subscription_routes.run_router,
        parking_routes.router,
        dependency_routes.router,
        variable_routes.router,
        script_routes.router,
        subscription_routes.router,
        stats_routes.router,
        backup_routes.router,
        session_routes.router,
    ):
        app.include_router(router, responses=errors.API_ERROR_RESPONSES)
    for extension in extensions:
        extension.install(app)
    app.include_router(console.router)
    _document_body_errors(app)
    return app


def _document_body_errors(app: FastAPI) -> None:
    """Every operation that reads a JSON body also answers 400 ``malformed_json`` (stated once here,
    in the generated document, rather than on each route)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                if isinstance(operation, dict) and "requestBody" in operation:
                    operation.setdefault("responses", {}).setdefault(
                        "400",
                        {
                            "description": errors.MALFORMED_JSON_DESCRIPTION,
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}
                            },
                        },
                    )
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
