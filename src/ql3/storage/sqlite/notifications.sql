-- dialect-only: the due page has no shared text. SQLite: writers are serialised by BEGIN IMMEDIATE,
-- so the due page needs no row locks.

-- name: notify_due_page
-- desc: A page of due outbox rows (id, attempts) for delivery; no row locks, writers are serialised.
SELECT id, attempts FROM notification_outbox WHERE due_at_ms IS NOT NULL AND due_at_ms <= :now
ORDER BY due_at_ms, id LIMIT :limit
