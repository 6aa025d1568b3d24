-- Sign-in with a name and a password (docs/security.md "Console sign-in"). `user_logins` gives a
-- principal a sign-in name, an argon2id password hash, an optional TOTP secret (sealed with the
-- server's secret box, like project secrets) and the lock-out state of that name. `user_sessions`
-- holds the console's cookie sessions: only the digest of the session secret is stored.
CREATE TABLE user_logins (
  principal_id TEXT PRIMARY KEY REFERENCES principals (id),
  login TEXT NOT NULL UNIQUE CHECK (length(login) BETWEEN 1 AND 128),
  password_hash TEXT NOT NULL CHECK (length(password_hash) BETWEEN 1 AND 512),
  totp_sealed TEXT CHECK (totp_sealed IS NULL OR length(totp_sealed) BETWEEN 1 AND 512),
  totp_last_step BIGINT,
  failed_count INTEGER NOT NULL DEFAULT 0 CHECK (failed_count >= 0),
  locked_until_ms BIGINT,
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL
);
CREATE TABLE user_sessions (
  id TEXT PRIMARY KEY,
  principal_id TEXT NOT NULL REFERENCES principals (id),
  secret_digest TEXT NOT NULL UNIQUE CHECK (length(secret_digest) = 64),
  created_at_ms BIGINT NOT NULL,
  last_seen_at_ms BIGINT NOT NULL,
  idle_timeout_ms BIGINT NOT NULL CHECK (idle_timeout_ms >= 1000),
  expires_at_ms BIGINT NOT NULL,
  revoked_at_ms BIGINT,
  client TEXT NOT NULL CHECK (length(client) <= 64),
  user_agent TEXT NOT NULL CHECK (length(user_agent) <= 256),
  CHECK (expires_at_ms > created_at_ms AND last_seen_at_ms >= created_at_ms)
);
CREATE INDEX user_sessions_by_principal ON user_sessions (principal_id, created_at_ms);
CREATE INDEX user_sessions_by_expiry ON user_sessions (expires_at_ms);
