-- The API's run creation (ql3/http/run_intake.py): what it reads before it writes, in one statement.
-- :task_id is NULL for a task ref that is no id; a missing task leaves the task and revision columns NULL.

-- name: run_create_target
-- desc: The project (id first, then name), the caller's role there, its live task (id first) and that task's revision.
SELECT p.id AS project_id, p.name AS project_name, p.version AS project_version,
       p.created_at_ms AS project_created_at_ms, b.role AS role,
       t.id AS task_id, t.name AS task_name, t.enabled AS task_enabled, t.revision AS task_revision,
       t.created_at_ms AS task_created_at_ms, t.updated_at_ms AS task_updated_at_ms,
       r.revision AS revision, r.spec_json AS spec_json, r.content_digest AS content_digest,
       r.created_at_ms AS revision_created_at_ms
FROM projects p
LEFT JOIN role_bindings b ON b.principal_id = :principal_id AND b.project_id = p.id
LEFT JOIN tasks t ON t.project_id = p.id AND t.deleted_at_ms IS NULL AND (t.id = :task_id OR t.name = :task)
LEFT JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision
WHERE p.id = :project OR p.name = :project
ORDER BY CASE WHEN p.id = :project THEN 0 ELSE 1 END, CASE WHEN t.id = :task_id THEN 0 ELSE 1 END
LIMIT 1
