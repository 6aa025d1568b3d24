-- PostgreSQL cancellation overrides. Lock order: Run -> Attempt -> CancellationDispatch.

-- name: cancel_dispatch_lock
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id FOR UPDATE
