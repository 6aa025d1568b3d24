"""An online backup of the whole SQLite database, streamed to the owner (docs/operations.md, "Backups").

The copy is made with SQLite's online backup API (one read snapshot; the server keeps writing), checked,
and streamed from a private temporary file that is removed once sent. It holds every project, so only
the owner may take it; every download is logged on ``ql3.audit`` with who took it and its size.
PostgreSQL has no such copy here: 409 ``backup_not_supported`` (use pg_dump).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from ql3.domain.errors import Conflict, PermissionDenied
from ql3.http.auth import DbDep, PrincipalDep

router = APIRouter(prefix="/api/v1", tags=["backup"])
audit = logging.getLogger("ql3.audit")


class BackupNotSupported(Conflict):
    """The database is not SQLite: back PostgreSQL up with pg_dump."""

    code = "backup_not_supported"


@router.get(
    "/backup",
    response_class=FileResponse,
    responses={200: {"content": {"application/vnd.sqlite3": {}}, "description": "the SQLite file"}},
)
def download_backup(db: DbDep, principal: PrincipalDep) -> FileResponse:
    """A consistent copy of the SQLite database as a file (owner only; logged). Run logs are files
    under ``$QL3_HOME/worker/logs`` and are not in it. Restore it with ``ql3 db restore FILE``."""
    if not principal.is_owner:
        raise PermissionDenied("only the owner downloads backups", permission="server.backup")
    path = getattr(db, "path", None)
    backup = getattr(db, "online_backup", None)
    if not isinstance(path, str) or backup is None:
        raise BackupNotSupported(
            "online backup works on SQLite; back PostgreSQL up with pg_dump (docs/operations.md)"
        )
    source = Path(path)
    workdir = Path(tempfile.mkdtemp(prefix=".ql3-backup-", dir=source.parent))
    try:
        target = workdir / "ql3-backup.db"
        version = int(backup(target))
        size = target.stat().st_size
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    audit.info(
        "backup downloaded",
        extra={
            "action": "backup.download",
            "principal_id": principal.id,
            "principal": principal.name,
            "bytes": size,
            "schema_version": version,
        },
    )
    return FileResponse(
        target,
        media_type="application/vnd.sqlite3",
        filename=f"ql3-backup-{stamp}.db",
        headers={"Cache-Control": "no-store", "X-Ql3-Schema-Version": str(version)},
        background=BackgroundTask(shutil.rmtree, workdir, ignore_errors=True),
    )
