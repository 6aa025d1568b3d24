"""The worker's session with the control plane: registered (or resumed) at start, kept in
``session.json`` so a restarted host resumes its own session and keeps its leases' authority.

A session's content (slots and capabilities, labels included) is fixed at its registration. A worker
restarted with other content registers a new session with it instead of resuming: the new session
replaces the old one and fences everything it held (its processes are stopped and their runs retried
by their lost-retry policy, docs/cluster.md "Changing a worker's slots or labels")."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from ql3.domain.errors import Conflict
from ql3.domain.ids import new_id
from ql3.ports.control_plane import ControlPlane, SessionInfo
from ql3.worker.config import WorkerConfig

log = logging.getLogger("ql3.worker")
CONTENT_CHANGED = "session_content_changed"


class WorkerSession:
    """The current session (None before start and once fenced: no intake, no maintenance)."""

    def __init__(self, client: ControlPlane, config: WorkerConfig) -> None:
        self._client = client
        self._config = config
        self.current: SessionInfo | None = None

    @property
    def path(self) -> Path:
        return self._config.home / "session.json"

    def register(self) -> SessionInfo:
        """Resume the stored session (or start a new one) and remember the id the control plane gave."""
        session_id = self._load_session_id()
        try:
            self.current = self._register(session_id)
        except Conflict as exc:
            # A session.json written before its content was kept: the control plane tells the change.
            if exc.details.get("reason") != CONTENT_CHANGED:
                raise
            self._changed()
            self.current = self._register(new_id())
        self._save_session_id(self.current.session_id)
        return self.current

    def _register(self, session_id: str) -> SessionInfo:
        return self._client.register(
            worker_id=self._config.worker_id,
            session_id=session_id,
            capabilities=self._config.capabilities,
            max_concurrent_runs=self._config.slots,
            session_lease_ms=self._config.session_lease_ms,
        )

    def _content(self) -> str:
        """What the control plane compares when a session is resumed: slots and capabilities."""
        content = {"slots": self._config.slots, "capabilities": self._config.capabilities}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    def _changed(self) -> None:
        log.warning(
            "slots or labels changed since the last start: registering a new session (the old one is"
            " fenced: its runs are stopped here and retried by their lost-retry policy)",
            extra={"action": "worker.session_content_changed"},
        )

    def _load_session_id(self) -> str:
        # Resuming our own session keeps the leases' authority across a restart of this host; a
        # session replaced by someone else is fenced and a fresh one is registered instead.
        try:
            data = json.loads(self.path.read_text())
            if data.get("worker_id") == self._config.worker_id and isinstance(data.get("session_id"), str):
                stored = data.get("content")
                if isinstance(stored, str) and stored != self._content():
                    self._changed()
                    return new_id()
                return str(data["session_id"])
        except (OSError, ValueError):
            pass
        return new_id()

    def _save_session_id(self, session_id: str) -> None:
        path = self.path
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            content = self._content()
            json.dump({"worker_id": self._config.worker_id, "session_id": session_id, "content": content}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
