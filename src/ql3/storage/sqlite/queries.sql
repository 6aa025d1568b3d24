-- SQLite overrides. Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read (locks.sql).

-- The candidate page must read the partial index in its order: without statistics SQLite would
-- otherwise pick another index and sort the whole backlog.

-- name: candidate_first
-- desc: First page of dispatch candidates in dispatch order, forced onto the partial candidate index.
SELECT r.id AS run_id, r.project_id, r.task_id, r.task_revision, r.priority, r.queued_at_ms,
  (SELECT a.id FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_id,
  (SELECT a.status FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_status
FROM runs r INDEXED BY runs_dispatch_candidates WHERE r.status = 'queued' AND r.cancel_requested_at_ms IS NULL
ORDER BY r.priority DESC, r.queued_at_ms, r.id LIMIT :limit

-- name: candidate_after
-- desc: Next page of dispatch candidates after the cursor, forced onto the partial candidate index.
SELECT r.id AS run_id, r.project_id, r.task_id, r.task_revision, r.priority, r.queued_at_ms,
  (SELECT a.id FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_id,
  (SELECT a.status FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_status
FROM runs r INDEXED BY runs_dispatch_candidates WHERE r.status = 'queued' AND r.cancel_requested_at_ms IS NULL
  AND (r.priority < :c_priority OR (r.priority = :c_priority AND (r.queued_at_ms > :c_queued
       OR (r.queued_at_ms = :c_queued AND r.id > :c_id))))
ORDER BY r.priority DESC, r.queued_at_ms, r.id LIMIT :limit
