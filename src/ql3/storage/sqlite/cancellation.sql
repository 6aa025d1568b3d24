-- SQLite cancellation overrides: writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read.

-- name: cancel_dispatch_lock
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id
