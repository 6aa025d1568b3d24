-- Project settings (docs/tasks.md "Time zones").

-- name: project_settings_get
-- desc: A project's settings row (its default time zone); no row when none was ever set.
SELECT project_id, default_tz, updated_at_ms FROM project_settings WHERE project_id = :project_id

-- name: project_settings_set_tz
-- desc: Creates or replaces a project's default time zone (NULL: UTC).
INSERT INTO project_settings (project_id, default_tz, updated_at_ms) VALUES (:project_id, :default_tz, :now)
ON CONFLICT (project_id) DO UPDATE SET default_tz = excluded.default_tz, updated_at_ms = excluded.updated_at_ms
