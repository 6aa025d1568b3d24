-- SQLite cancellation overrides (the locked read of a dispatch is in locks.sql).

-- name: cancel_intent_first
-- desc: First page of live runs with a cancel intent whose dispatch is missing, due or expired; names the partial index.
-- The supervisor's intent pages (shared text in storage/sql/cancellation.sql) with the index named: for
-- the status list SQLite's planner otherwise picks runs_status, i.e. it visits every queued run of the
-- backlog on each cycle (13 ms per cycle with 100,000 queued), where the partial index holds only the
-- live runs with a cancel request, already in the page's order (bench/README.md, "cost flat in backlog").
SELECT r.id AS run_id, r.cancel_requested_at_ms FROM runs r INDEXED BY runs_live_cancel_intent
LEFT JOIN cancellation_dispatches d ON d.run_id = r.id
WHERE r.cancel_requested_at_ms IS NOT NULL
  AND r.status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost')
  AND (d.run_id IS NULL
       OR (d.status IN ('pending', 'retry_wait') AND d.next_attempt_at_ms <= :now)
       OR (d.status = 'leased' AND d.lease_expires_at_ms <= :now))
ORDER BY r.cancel_requested_at_ms, r.id LIMIT :limit

-- name: cancel_intent_after
-- desc: Next page of cancel intents after the (cancel_requested_at_ms, id) cursor; names the partial index.
SELECT r.id AS run_id, r.cancel_requested_at_ms FROM runs r INDEXED BY runs_live_cancel_intent
LEFT JOIN cancellation_dispatches d ON d.run_id = r.id
WHERE r.cancel_requested_at_ms IS NOT NULL
  AND r.status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost')
  AND (r.cancel_requested_at_ms > :c_ms OR (r.cancel_requested_at_ms = :c_ms AND r.id > :c_id))
  AND (d.run_id IS NULL
       OR (d.status IN ('pending', 'retry_wait') AND d.next_attempt_at_ms <= :now)
       OR (d.status = 'leased' AND d.lease_expires_at_ms <= :now))
ORDER BY r.cancel_requested_at_ms, r.id LIMIT :limit
