"""Project settings: the default time zone of new cron schedules (docs/tasks.md "Time zones")."""

from __future__ import annotations

from ql3.ports.storage import Transaction


def get_default_zone(tx: Transaction, project_id: str) -> str | None:
    """The project's default zone, or None (UTC) when none is set."""
    row = tx.one("project_settings_get", {"project_id": project_id})
    return None if row is None else row["default_tz"]


def set_default_zone(tx: Transaction, project_id: str, zone_name: str | None) -> None:
    """Replace the project's default zone; None means UTC."""
    tx.run("project_settings_set_tz", {"project_id": project_id, "default_tz": zone_name, "now": tx.now_ms()})
