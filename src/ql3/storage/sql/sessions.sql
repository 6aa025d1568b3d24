-- Sign-in names, password hashes, TOTP secrets (sealed), lock-out state and the console's cookie
-- sessions (docs/security.md "Console sign-in"). A session's secret is stored only as its digest.

-- name: login_by_name
-- desc: A sign-in name with its principal (revoked principals too: the caller refuses them).
SELECT l.principal_id, l.login, l.password_hash, l.totp_sealed, l.totp_last_step, l.failed_count,
  l.locked_until_ms, l.created_at_ms, l.updated_at_ms, p.name, p.kind, p.is_owner,
  p.created_at_ms AS principal_created_at_ms, p.disabled_at_ms
FROM user_logins l JOIN principals p ON p.id = l.principal_id
WHERE l.login = :login

-- name: login_by_principal
-- desc: The sign-in name of a principal, if it has one.
SELECT l.principal_id, l.login, l.password_hash, l.totp_sealed, l.totp_last_step, l.failed_count,
  l.locked_until_ms, l.created_at_ms, l.updated_at_ms, p.name, p.kind, p.is_owner,
  p.created_at_ms AS principal_created_at_ms, p.disabled_at_ms
FROM user_logins l JOIN principals p ON p.id = l.principal_id
WHERE l.principal_id = :principal_id

-- name: login_insert
-- desc: Gives a principal a sign-in name and password hash; no row when the name or the principal has one.
INSERT INTO user_logins (principal_id, login, password_hash, failed_count, created_at_ms, updated_at_ms)
VALUES (:principal_id, :login, :password_hash, 0, :now, :now)
ON CONFLICT DO NOTHING

-- name: login_set_password
-- desc: Replaces a password hash and clears the name's lock-out.
UPDATE user_logins SET password_hash = :password_hash, failed_count = 0, locked_until_ms = NULL,
  updated_at_ms = :now
WHERE principal_id = :principal_id

-- name: login_set_totp
-- desc: Sets (sealed) or clears a TOTP secret; the replay guard starts again.
UPDATE user_logins SET totp_sealed = :totp_sealed, totp_last_step = NULL, updated_at_ms = :now
WHERE principal_id = :principal_id

-- name: login_record_failure
-- desc: Counts a failed sign-in of a name (a lapsed lock-out starts the count again) and locks the name at the limit.
UPDATE user_logins SET
  failed_count = CASE WHEN locked_until_ms IS NOT NULL AND locked_until_ms <= :now THEN 1 ELSE failed_count + 1 END,
  locked_until_ms = CASE
    WHEN locked_until_ms IS NOT NULL AND locked_until_ms <= :now THEN NULL
    WHEN failed_count + 1 >= :max_failures THEN :lock_until
    ELSE locked_until_ms END
WHERE principal_id = :principal_id

-- name: login_record_success
-- desc: Clears a name's failures after a sign-in and records the TOTP step used (the replay guard).
UPDATE user_logins SET failed_count = 0, locked_until_ms = NULL, totp_last_step = :totp_last_step
WHERE principal_id = :principal_id

-- name: login_delete
-- desc: Removes a principal's sign-in name (its sessions are revoked separately).
DELETE FROM user_logins WHERE principal_id = :principal_id

-- name: login_list_project
-- desc: A page of the sign-in names of the principals bound to a project, by name.
SELECT l.principal_id, l.login, l.password_hash, l.totp_sealed, l.totp_last_step, l.failed_count,
  l.locked_until_ms, l.created_at_ms, l.updated_at_ms, p.name, p.kind, p.is_owner,
  p.created_at_ms AS principal_created_at_ms, p.disabled_at_ms
FROM user_logins l JOIN principals p ON p.id = l.principal_id
JOIN role_bindings b ON b.principal_id = l.principal_id AND b.project_id = :project_id
WHERE l.login > :after
ORDER BY l.login LIMIT :limit

-- name: session_insert
-- desc: A new console session (its secret's digest only).
INSERT INTO user_sessions (id, principal_id, secret_digest, created_at_ms, last_seen_at_ms, idle_timeout_ms,
  expires_at_ms, client, user_agent)
VALUES (:id, :principal_id, :secret_digest, :now, :now, :idle_timeout_ms, :expires_at_ms, :client, :user_agent)

-- name: session_by_digest
-- desc: The session whose secret has this digest, with its principal.
SELECT s.id, s.principal_id, s.secret_digest, s.created_at_ms, s.last_seen_at_ms, s.idle_timeout_ms,
  s.expires_at_ms, s.revoked_at_ms, s.client, s.user_agent, p.name, p.kind, p.is_owner,
  p.created_at_ms AS principal_created_at_ms, p.disabled_at_ms
FROM user_sessions s JOIN principals p ON p.id = s.principal_id
WHERE s.secret_digest = :secret_digest

-- name: session_get
-- desc: One session by id.
SELECT id, principal_id, secret_digest, created_at_ms, last_seen_at_ms, idle_timeout_ms, expires_at_ms,
  revoked_at_ms, client, user_agent
FROM user_sessions WHERE id = :id

-- name: session_touch
-- desc: Records a session's use (its idle expiry moves on), at most once per granularity, never past its end.
UPDATE user_sessions SET last_seen_at_ms = :now
WHERE id = :id AND revoked_at_ms IS NULL AND last_seen_at_ms < :stale_before AND expires_at_ms > :now

-- name: session_revoke
-- desc: Revokes one session unless it already is.
UPDATE user_sessions SET revoked_at_ms = :now WHERE id = :id AND revoked_at_ms IS NULL

-- name: session_revoke_principal
-- desc: Revokes every live session of a principal (a new password, a removed sign-in).
UPDATE user_sessions SET revoked_at_ms = :now WHERE principal_id = :principal_id AND revoked_at_ms IS NULL

-- name: session_list_principal
-- desc: A principal's live sessions (not revoked, not past their idle or absolute end), newest first.
SELECT id, principal_id, secret_digest, created_at_ms, last_seen_at_ms, idle_timeout_ms, expires_at_ms,
  revoked_at_ms, client, user_agent
FROM user_sessions
WHERE principal_id = :principal_id AND revoked_at_ms IS NULL AND expires_at_ms > :now
  AND last_seen_at_ms + idle_timeout_ms > :now
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: session_prune_principal
-- desc: Deletes a principal's sessions that ended (revoked or expired) before :before.
DELETE FROM user_sessions
WHERE principal_id = :principal_id AND (expires_at_ms < :before OR revoked_at_ms < :before)
