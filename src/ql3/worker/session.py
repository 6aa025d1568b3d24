"""The worker's session with the control plane: registered (or resumed) at start, kept in
``session.json`` so a restarted host resumes its own session and keeps its leases' authority."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ql3.domain.ids import new_id
from ql3.ports.control_plane import ControlPlane, SessionInfo
from ql3.worker.config import WorkerConfig


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
        self.current = self._client.register(
            worker_id=self._config.worker_id,
            session_id=session_id,
            capabilities=self._config.capabilities,
            max_concurrent_runs=self._config.slots,
            session_lease_ms=self._config.session_lease_ms,
        )
        self._save_session_id(self.current.session_id)
        return self.current

    def _load_session_id(self) -> str:
        # Resuming our own session keeps the leases' authority across a restart of this host; a
        # session replaced by someone else is fenced and a fresh one is registered instead.
        try:
            data = json.loads(self.path.read_text())
            if data.get("worker_id") == self._config.worker_id and isinstance(data.get("session_id"), str):
                return str(data["session_id"])
        except (OSError, ValueError):
            pass
        return new_id()

    def _save_session_id(self, session_id: str) -> None:
        path = self.path
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"worker_id": self._config.worker_id, "session_id": session_id}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
