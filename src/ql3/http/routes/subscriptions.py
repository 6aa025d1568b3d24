"""Subscriptions (docs/scripts.md "Subscriptions"): a git repository synced into a project's scripts.
Adding, removing and syncing need ``project.admin``; reading needs ``task.read``. A deploy key or token
is write-only: no response carries it (``has_credential`` says whether one is kept)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field

from ql3.application import auth, subscriptions
from ql3.domain.errors import SyncUnavailable
from ql3.domain.scripts import MAX_DEPLOY_KEY_CHARS, Subscription, SubscriptionSync
from ql3.http.auth import DbDep, PrincipalDep, bearer
from ql3.http.dto import Body
from ql3.ports.storage import Transaction
from ql3.ports.vcs import GitFetcher

router = APIRouter(prefix="/api/v1/projects/{project}/subscriptions", tags=["subscriptions"])
# The sync run's own call (``ql3 subscription sync-run``), authenticated by the run's credential.
run_router = APIRouter(prefix="/api/v1", tags=["subscriptions"])
ADMIN = "project.admin"


class SubscriptionCreate(Body):
    name: str = Field(max_length=128)
    repo: str = Field(max_length=2048, description="https://, http://, ssh://, file:// or user@host:path")
    branch: str | None = Field(default=None, max_length=255)
    path: str | None = Field(default=None, max_length=255, description="a glob of the files to take")
    cron: str | None = Field(default=None, max_length=256, description="when to sync (UTC)")
    deploy_key: str | None = Field(
        default=None, max_length=MAX_DEPLOY_KEY_CHARS, description="SSH private key; write-only"
    )
    token: str | None = Field(default=None, max_length=4096, description="HTTPS token; write-only")


class SubscriptionOut(BaseModel):
    id: str
    name: str
    repo: str
    branch: str | None
    path: str | None
    cron: str | None
    has_credential: bool
    next_sync_at_ms: int | None
    created_at_ms: int


class SubscriptionPage(BaseModel):
    items: list[SubscriptionOut]


class SyncOut(BaseModel):
    id: str
    trigger: str
    status: str
    commit: str | None
    summary: str | None
    log: str
    started_at_ms: int
    ended_at_ms: int | None
    run_id: str | None = Field(description="the run of the task ql3-sync-NAME that made this sync")


class SyncStarted(BaseModel):
    run_id: str = Field(description="the sync run: follow its log, its outcome is the sync's")
    task: str


class SyncPage(BaseModel):
    items: list[SyncOut]


def subscription_out(sub: Subscription) -> SubscriptionOut:
    return SubscriptionOut(
        id=sub.id,
        name=sub.name,
        repo=sub.repo_url,
        branch=sub.branch,
        path=sub.path_glob,
        cron=sub.cron,
        has_credential=sub.deploy_key is not None,
        next_sync_at_ms=sub.next_sync_at_ms,
        created_at_ms=sub.created_at_ms,
    )


def sync_out(found: SubscriptionSync) -> SyncOut:
    return SyncOut(
        id=found.id,
        trigger=found.trigger_type,
        status=found.status,
        commit=found.commit_sha,
        summary=found.summary,
        log=found.log,
        started_at_ms=found.started_at_ms,
        ended_at_ms=found.ended_at_ms,
        run_id=found.run_id,
    )


@router.get("", response_model=SubscriptionPage)
def list_subscriptions(project: str, db: DbDep, principal: PrincipalDep) -> SubscriptionPage:
    def unit(tx: Transaction) -> SubscriptionPage:
        found = auth.authorize(tx, principal, project, "task.read")
        return SubscriptionPage(
            items=[subscription_out(s) for s in subscriptions.list_subscriptions(tx, found.id)]
        )

    return db.transaction(unit, write=False)


@router.post("", response_model=SubscriptionOut, status_code=status.HTTP_201_CREATED)
def add_subscription(
    project: str, body: SubscriptionCreate, request: Request, db: DbDep, principal: PrincipalDep
) -> SubscriptionOut:
    """Add a subscription (validated before anything is written); sync it with ``POST .../syncs``. A
    deploy key or token is write-only and encrypted at rest with the server's secrets key: 503
    ``secrets_unavailable`` on a server without one."""

    def unit(tx: Transaction) -> SubscriptionOut:
        found = auth.authorize(tx, principal, project, ADMIN)
        new = subscriptions.NewSubscription(
            name=body.name,
            repo_url=body.repo,
            branch=body.branch,
            path_glob=body.path,
            cron=body.cron,
            deploy_key=body.deploy_key,
            token=body.token,
        )
        return subscription_out(subscriptions.add(tx, found.id, new, request.app.state.secret_box))

    return db.transaction(unit)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def remove_subscription(project: str, name: str, db: DbDep, principal: PrincipalDep) -> Response:
    """Remove a subscription and its sync history; the scripts and tasks it made stay."""

    def unit(tx: Transaction) -> None:
        found = auth.authorize(tx, principal, project, ADMIN)
        subscriptions.remove(tx, found.id, name)

    db.transaction(unit)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{name}/syncs", response_model=SyncPage)
def list_syncs(project: str, name: str, db: DbDep, principal: PrincipalDep) -> SyncPage:
    """The latest syncs, newest first, each with git's output and what it changed."""

    def unit(tx: Transaction) -> SyncPage:
        found = auth.authorize(tx, principal, project, "task.read")
        return SyncPage(items=[sync_out(s) for s in subscriptions.syncs(tx, found.id, name)])

    return db.transaction(unit, write=False)


@router.post("/{name}/syncs", response_model=SyncStarted, status_code=status.HTTP_201_CREATED)
def sync_now(project: str, name: str, db: DbDep, principal: PrincipalDep) -> SyncStarted:
    """Queue a sync run now (a run of the task ``ql3-sync-NAME``): its log is git's output and what
    changed; it fails when the sync failed, which changed nothing."""

    def unit(tx: Transaction) -> SyncStarted:
        found = auth.authorize(tx, principal, project, ADMIN)
        sub = subscriptions.find(tx, found.id, name)
        run = subscriptions.queue_sync(
            tx, sub, trigger_type="manual", actor_type="user", actor_id=principal.id
        )
        return SyncStarted(run_id=run.id, task=subscriptions.sync_task_name(sub.name))

    return db.transaction(unit)


@run_router.post("/subscription-sync", response_model=SyncOut, status_code=status.HTTP_201_CREATED)
def sync_in_run(
    request: Request,
    db: DbDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> SyncOut:
    """The sync itself, asked by a running sync run with its own credential (``$QL3_NOTIFY_TOKEN``):
    answers when it has ended (at most the fetch timeout), 201 with ``status: failed`` too. 401
    ``notify_credential_invalid`` once the run has ended; 422 for a run that is not a sync run."""
    token = credentials.credentials if credentials else None
    target = db.transaction(lambda tx: subscriptions.sync_target(tx, token), write=False)
    fetcher: GitFetcher | None = request.app.state.git
    if fetcher is None:
        raise SyncUnavailable("this server does not sync subscriptions")
    syncer = subscriptions.Syncer(db, fetcher, box=request.app.state.secret_box)
    return sync_out(syncer.sync(target.subscription_id, target.trigger, target.run_id))
