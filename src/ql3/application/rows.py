"""Row -> record mapping for the named queries' result columns, for the modules that still run
queries themselves; a repository maps the rows it reads (tasks: ``repositories/tasks.py``,
projects: ``repositories/projects.py``, runs, attempts and events: ``repositories/runs.py``)."""

from __future__ import annotations

from ql3.repositories.runs import attempt_from_row, event_from_row, run_from_row

# The mappings live in their repository; these names keep the modules not yet migrated working.
run = run_from_row
event = event_from_row
attempt = attempt_from_row
