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

-- name: lookup_token_ids
-- desc: A project's token (principal) ids starting with a prefix, with names, for the CLI's short ids.
SELECT p.id, p.name FROM role_bindings b JOIN principals p ON p.id = b.principal_id
WHERE b.project_id = :project_id AND substr(p.id, 1, :n) = :prefix ORDER BY p.id LIMIT :limit

-- name: lookup_token_names
-- desc: A project's tokens (principals) with exactly this name, for the CLI's names.
SELECT p.id, p.name FROM role_bindings b JOIN principals p ON p.id = b.principal_id
WHERE b.project_id = :project_id AND p.name = :name ORDER BY p.id LIMIT :limit

-- name: lookup_channel_ids
-- desc: A project's notification channel ids starting with a prefix, with names, for the CLI.
SELECT id, name FROM notification_channels WHERE project_id = :project_id AND substr(id, 1, :n) = :prefix
ORDER BY id LIMIT :limit

-- name: lookup_channel_names
-- desc: A project's notification channel of this name (names are unique in a project), for the CLI.
SELECT id, name FROM notification_channels WHERE project_id = :project_id AND name = :name
ORDER BY id LIMIT :limit

-- name: lookup_rule_ids
-- desc: A project's notification rule ids starting with a prefix, for the CLI's short ids.
SELECT id, id AS name FROM notification_rules WHERE project_id = :project_id AND substr(id, 1, :n) = :prefix
ORDER BY id LIMIT :limit

-- name: lookup_subscription_ids
-- desc: A project's subscription ids starting with a prefix, with names, for the CLI.
SELECT id, name FROM subscriptions WHERE project_id = :project_id AND substr(id, 1, :n) = :prefix
ORDER BY id LIMIT :limit

-- name: lookup_subscription_names
-- desc: A project's subscription of this name (names are unique in a project), for the CLI.
SELECT id, name FROM subscriptions WHERE project_id = :project_id AND name = :name ORDER BY id LIMIT :limit

-- name: lookup_worker_ids
-- desc: Worker ids (workers serve every project) starting with a prefix, case as given, for the CLI.
SELECT worker_id AS id, worker_id AS name FROM workers
WHERE substr(worker_id, 1, :n) = :prefix ORDER BY worker_id LIMIT :limit

-- name: lookup_worker_names
-- desc: The worker with exactly this id, so that a short worker id is not taken for a prefix.
SELECT worker_id AS id, worker_id AS name FROM workers
WHERE worker_id = :name ORDER BY worker_id LIMIT :limit
