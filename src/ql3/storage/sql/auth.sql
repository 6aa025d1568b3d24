-- Token lifecycle: listing, revocation, rotation, last use; the digest key; whoami.

-- name: token_list
-- desc: A page of a project's tokens (principals with a binding): role, expiry, revocation and last use.
SELECT p.id, p.name, b.role, p.is_owner, p.created_at_ms, p.expires_at_ms, p.disabled_at_ms AS revoked_at_ms,
  p.last_used_at_ms
FROM role_bindings b JOIN principals p ON p.id = b.principal_id
WHERE b.project_id = :project_id AND p.id > :after
ORDER BY p.id LIMIT :limit

-- name: token_get
-- desc: One token of a project with its role and issue time, for inspect, revoke and rotate.
SELECT p.id, p.name, b.role, p.is_owner, p.created_at_ms, p.expires_at_ms, p.disabled_at_ms AS revoked_at_ms,
  p.last_used_at_ms, p.token_issued_at_ms
FROM role_bindings b JOIN principals p ON p.id = b.principal_id
WHERE b.project_id = :project_id AND p.id = :id

-- name: principal_bindings
-- desc: A principal's role bindings with project names, for whoami.
SELECT b.project_id, b.role, pr.name AS project_name
FROM role_bindings b JOIN projects pr ON pr.id = b.project_id
WHERE b.principal_id = :principal_id
ORDER BY pr.name LIMIT :limit

-- name: principal_revoke
-- desc: Revokes a principal's token (sets disabled_at_ms) unless it is already revoked.
UPDATE principals SET disabled_at_ms = :now WHERE id = :id AND disabled_at_ms IS NULL

-- name: principal_rotate
-- desc: Replaces an enabled principal's token, expiry and issuer (kept when it rotates its own); clears its last use.
UPDATE principals SET token_digest = :token_digest, token_issued_at_ms = :now, expires_at_ms = :expires_at_ms,
  last_used_at_ms = NULL, issued_by = CASE WHEN :issued_by = id THEN issued_by ELSE :issued_by END
WHERE id = :id AND disabled_at_ms IS NULL

-- name: principal_touch
-- desc: Records a principal's last use, only when the stored time is older than the staleness bound.
UPDATE principals SET last_used_at_ms = :now
WHERE id = :id AND (last_used_at_ms IS NULL OR last_used_at_ms < :stale_before)

-- name: server_key_get
-- desc: A secret key the database keeps for the server (e.g. the content-digest key), by name.
SELECT key_hex FROM server_keys WHERE name = :name
