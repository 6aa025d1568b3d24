-- Lookups for the CLI: ids by unique prefix, and principal names. Prefixes compare with substr (an
-- exact byte match in every collation); each query returns at most :limit rows.

-- name: lookup_run_ids
-- desc: A project's run ids starting with a prefix, for the CLI's short ids.
SELECT id FROM runs WHERE project_id = :project_id AND substr(id, 1, :n) = :prefix ORDER BY id LIMIT :limit

-- name: lookup_approval_ids
-- desc: A project's approval request ids starting with a prefix, for the CLI's short ids.
SELECT id FROM approval_requests WHERE project_id = :project_id AND substr(id, 1, :n) = :prefix
ORDER BY id LIMIT :limit

-- name: lookup_action_ids
-- desc: A project's approved-action dispatch ids starting with a prefix, for the CLI's short ids.
SELECT id FROM approved_action_dispatches WHERE project_id = :project_id AND substr(id, 1, :n) = :prefix
ORDER BY id LIMIT :limit

-- name: lookup_task_ids
-- desc: A project's live task ids starting with a prefix, for the CLI's short ids.
SELECT id FROM tasks WHERE project_id = :project_id AND deleted_at_ms IS NULL AND substr(id, 1, :n) = :prefix
ORDER BY id LIMIT :limit

-- name: lookup_principal_name
-- desc: A principal's name and kind if it is an owner or bound to the project, to show names not ids.
SELECT p.id, p.name, p.kind FROM principals p
WHERE p.id = :id AND (p.is_owner = 1 OR EXISTS (
  SELECT 1 FROM role_bindings b WHERE b.principal_id = p.id AND b.project_id = :project_id))
