"""A project's settings: the default time zone of its new cron schedules (docs/tasks.md "Time zones")."""

from __future__ import annotations

from ql3.domain.model import Project
from ql3.domain.timezones import validate_zone
from ql3.ports.storage import Transaction
from ql3.repositories import project_settings as repo


def default_zone(tx: Transaction, project: Project) -> str | None:
    """The zone new schedules of the project are written in when they name none; None is UTC."""
    return repo.get_default_zone(tx, project.id)


def set_default_zone(tx: Transaction, project: Project, zone_name: str | None) -> str | None:
    """Replace the project's default zone (None: UTC); an unknown zone is refused, nothing written.
    Existing schedules keep the zone they were written in."""
    checked = None if zone_name is None else validate_zone(zone_name, "default_tz")
    repo.set_default_zone(tx, project.id, checked)
    return checked
