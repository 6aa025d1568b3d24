-- dialect-only: the due page has no shared text. PostgreSQL: replicas claim disjoint pages.

-- name: notify_due_page
-- desc: A page of due outbox rows (id, attempts), locked with SKIP LOCKED so replicas claim disjoint pages.
SELECT id, attempts FROM notification_outbox WHERE due_at_ms IS NOT NULL AND due_at_ms <= :now
ORDER BY due_at_ms, id LIMIT :limit FOR UPDATE SKIP LOCKED
