-- name: script_get
-- desc: One live script of a project with its current content, or no row.
SELECT s.project_id, s.path, s.revision, s.digest, s.size_bytes, s.updated_at_ms, s.updated_by, r.content
FROM scripts s JOIN script_revisions r ON r.project_id = s.project_id AND r.path = s.path AND r.revision = s.revision
WHERE s.project_id = :project_id AND s.path = :path

-- name: script_list
-- desc: A page of a project's live scripts by path, after :after (no content).
SELECT project_id, path, revision, digest, size_bytes, updated_at_ms, updated_by, NULL AS content FROM scripts
WHERE project_id = :project_id AND path > :after ORDER BY path LIMIT :limit

-- name: script_count
-- desc: How many live scripts a project has (the per-project cap).
SELECT count(*) AS n FROM scripts WHERE project_id = :project_id

-- name: script_last_revision
-- desc: The highest revision a path ever had (a deleted path continues its numbering), 0 when none.
SELECT coalesce(max(revision), 0) AS revision FROM script_revisions WHERE project_id = :project_id AND path = :path

-- name: script_upsert
-- desc: Points a path at a new current revision (creates the row for a new or deleted path).
INSERT INTO scripts (project_id, path, revision, digest, size_bytes, updated_at_ms, updated_by)
VALUES (:project_id, :path, :revision, :digest, :size_bytes, :now, :author)
ON CONFLICT (project_id, path) DO UPDATE SET revision = excluded.revision, digest = excluded.digest,
  size_bytes = excluded.size_bytes, updated_at_ms = excluded.updated_at_ms, updated_by = excluded.updated_by

-- name: script_delete
-- desc: Removes a path's live row (its revisions stay).
DELETE FROM scripts WHERE project_id = :project_id AND path = :path

-- name: script_revision_insert
-- desc: Appends one immutable revision of a path (content and digest NULL for a deletion).
INSERT INTO script_revisions (project_id, path, revision, content, digest, author, source, created_at_ms)
VALUES (:project_id, :path, :revision, :content, :digest, :author, :source, :now)

-- name: script_revision_get
-- desc: One revision of a path, with its content.
SELECT project_id, path, revision, content, digest, author, source, created_at_ms FROM script_revisions
WHERE project_id = :project_id AND path = :path AND revision = :revision

-- name: script_revision_list
-- desc: A path's revisions, newest first, without content.
SELECT project_id, path, revision, NULL AS content, digest, author, source, created_at_ms FROM script_revisions
WHERE project_id = :project_id AND path = :path ORDER BY revision DESC LIMIT :limit

-- name: subscription_insert
-- desc: A new subscription; no row when the project already has one of that name.
INSERT INTO subscriptions (id, project_id, name, repo_url, branch, path_glob, cron, deploy_key, next_sync_at_ms, created_at_ms)
VALUES (:id, :project_id, :name, :repo_url, :branch, :path_glob, :cron, :deploy_key, :next_sync_at_ms, :now)
ON CONFLICT (project_id, name) DO NOTHING

-- name: subscription_get
-- desc: One subscription of a project by name, the deploy key included (for the sync only).
SELECT id, project_id, name, repo_url, branch, path_glob, cron, deploy_key, next_sync_at_ms, created_at_ms
FROM subscriptions WHERE project_id = :project_id AND name = :name

-- name: subscription_get_by_id
-- desc: One subscription by id, the deploy key included (for the sync only).
SELECT id, project_id, name, repo_url, branch, path_glob, cron, deploy_key, next_sync_at_ms, created_at_ms
FROM subscriptions WHERE id = :id

-- name: subscription_list
-- desc: A project's subscriptions by name.
SELECT id, project_id, name, repo_url, branch, path_glob, cron, deploy_key, next_sync_at_ms, created_at_ms
FROM subscriptions WHERE project_id = :project_id ORDER BY name LIMIT :limit

-- name: subscription_delete
-- desc: Removes a subscription with its syncs and file map (scripts and tasks it made stay).
DELETE FROM subscriptions WHERE id = :id

-- name: subscription_due
-- desc: Ids of subscriptions whose scheduled sync time has come, earliest first.
SELECT id FROM subscriptions WHERE next_sync_at_ms IS NOT NULL AND next_sync_at_ms <= :now
ORDER BY next_sync_at_ms, id LIMIT :limit

-- name: subscription_set_next
-- desc: Moves a subscription's next scheduled sync (compare-and-set on the time read).
UPDATE subscriptions SET next_sync_at_ms = :next_sync_at_ms
WHERE id = :id AND next_sync_at_ms = :expected

-- name: subscription_plaintext_credentials
-- desc: Subscriptions whose credential is still stored in plaintext (an older version's ssh:/token: form), to seal them.
SELECT id, project_id, name, deploy_key FROM subscriptions
WHERE substr(deploy_key, 1, 4) = 'ssh:' OR substr(deploy_key, 1, 6) = 'token:'
ORDER BY id LIMIT :limit

-- name: subscription_replace_credential
-- desc: Replaces a subscription's stored credential (compare-and-set on the text read).
UPDATE subscriptions SET deploy_key = :credential WHERE id = :id AND deploy_key = :expected

-- name: subscription_sync_insert
-- desc: A sync in state running.
INSERT INTO subscription_syncs (id, subscription_id, project_id, trigger_type, status, log, started_at_ms, run_id)
VALUES (:id, :subscription_id, :project_id, :trigger_type, 'running', '', :now, :run_id)

-- name: subscription_sync_finish
-- desc: Ends a running sync with its outcome, commit, summary and log.
UPDATE subscription_syncs SET status = :status, commit_sha = :commit_sha, summary = :summary, log = :log,
  ended_at_ms = :now WHERE id = :id AND status = 'running'

-- name: subscription_sync_list
-- desc: A subscription's syncs, newest first, with their logs.
SELECT id, subscription_id, project_id, trigger_type, status, commit_sha, summary, log, started_at_ms, ended_at_ms,
  run_id
FROM subscription_syncs WHERE subscription_id = :subscription_id ORDER BY started_at_ms DESC, id DESC LIMIT :limit

-- name: subscription_file_list
-- desc: The paths a subscription wrote and the task each one's header made, if any.
SELECT subscription_id, path, task_id FROM subscription_files WHERE subscription_id = :subscription_id ORDER BY path
LIMIT :limit

-- name: subscription_file_upsert
-- desc: Records that a subscription owns a path (and the task made from its header).
INSERT INTO subscription_files (subscription_id, path, task_id) VALUES (:subscription_id, :path, :task_id)
ON CONFLICT (subscription_id, path) DO UPDATE SET task_id = excluded.task_id

-- name: subscription_file_delete
-- desc: Forgets a path a subscription no longer has.
DELETE FROM subscription_files WHERE subscription_id = :subscription_id AND path = :path

-- name: subscription_earliest
-- desc: The earliest scheduled sync time of any subscription, NULL when none is scheduled.
SELECT min(next_sync_at_ms) AS due FROM subscriptions WHERE next_sync_at_ms IS NOT NULL
