-- dialect-only: the locked reads, which have no shared text: a plain read here, SELECT ... FOR UPDATE on PostgreSQL.
-- Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read.

-- name: run_lock
-- desc: One Run by id; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM runs WHERE id = :id

-- name: attempt_lock
-- desc: One Attempt by id; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM run_attempts WHERE id = :id

-- name: lease_lock
-- desc: An attempt's lease row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM run_leases WHERE attempt_id = :attempt_id

-- name: worker_lock
-- desc: One worker row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM workers WHERE worker_id = :worker_id

-- name: schedule_lock
-- desc: A task's schedule row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: cancel_dispatch_lock
-- desc: A run's cancellation dispatch; a plain read is a locked read (writers are serialised).
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id

-- name: approval_lock
-- desc: One approval request; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM approval_requests WHERE id = :id

-- name: aa_execution_lock
-- desc: An approved action's execution row; a plain read is a locked read (writers are serialised).
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id

-- name: aa_recovery_lock
-- desc: An approved action's recovery control; a plain read is a locked read (writers are serialised).
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id

-- name: fence_lock
-- desc: One statement: the Run and Attempt (given run_id), the lease, the worker, the pinned spec (with_revision).
SELECT
  (SELECT json_object('id', r.id, 'project_id', r.project_id, 'task_id', r.task_id,
    'task_revision', r.task_revision, 'trigger_type', r.trigger_type, 'trigger_id', r.trigger_id,
    'status', r.status, 'version', r.version, 'event_sequence', r.event_sequence,
    'priority', r.priority, 'idempotency_key', r.idempotency_key, 'request_id', r.request_id,
    'retry_of_run_id', r.retry_of_run_id, 'scheduled_for_ms', r.scheduled_for_ms,
    'created_at_ms', r.created_at_ms, 'queued_at_ms', r.queued_at_ms,
    'started_at_ms', r.started_at_ms, 'finished_at_ms', r.finished_at_ms,
    'cancel_requested_at_ms', r.cancel_requested_at_ms, 'cancel_reason', r.cancel_reason,
    'error_code', r.error_code, 'exit_code', r.exit_code, 'updated_at_ms', r.updated_at_ms)
   FROM runs r WHERE r.id = :run_id) AS run_row,
  (SELECT json_object('id', a.id, 'run_id', a.run_id, 'attempt', a.attempt, 'status', a.status,
    'executor_type', a.executor_type, 'worker_id', a.worker_id, 'pid', a.pid,
    'executor_handle', a.executor_handle, 'log_artifact_id', a.log_artifact_id,
    'deadline_at_ms', a.deadline_at_ms, 'callback_token_hash', a.callback_token_hash,
    'callback_sequence', a.callback_sequence, 'created_at_ms', a.created_at_ms,
    'started_at_ms', a.started_at_ms, 'finished_at_ms', a.finished_at_ms, 'exit_code', a.exit_code,
    'error_code', a.error_code)
   FROM run_attempts a WHERE a.id = :attempt_id AND :run_id IS NOT NULL) AS attempt_row,
  (SELECT json_object('attempt_id', l.attempt_id, 'run_id', l.run_id, 'status', l.status,
    'version', l.version, 'lease_generation', l.lease_generation, 'worker_id', l.worker_id,
    'worker_session_id', l.worker_session_id, 'worker_generation', l.worker_generation,
    'lease_token_digest', l.lease_token_digest, 'acquired_at_ms', l.acquired_at_ms,
    'renewed_at_ms', l.renewed_at_ms, 'expires_at_ms', l.expires_at_ms,
    'released_at_ms', l.released_at_ms, 'release_reason', l.release_reason,
    'completed_at_ms', l.completed_at_ms, 'updated_at_ms', l.updated_at_ms)
   FROM run_leases l WHERE l.attempt_id = :attempt_id) AS lease_row,
  (SELECT json_object('worker_id', w.worker_id, 'session_id', w.session_id, 'generation', w.generation,
    'status', w.status, 'version', w.version, 'capabilities_json', w.capabilities_json,
    'capabilities_hash', w.capabilities_hash, 'max_concurrent_runs', w.max_concurrent_runs,
    'active_leases', w.active_leases, 'session_lease_ms', w.session_lease_ms,
    'registered_at_ms', w.registered_at_ms, 'last_heartbeat_at_ms', w.last_heartbeat_at_ms,
    'lease_expires_at_ms', w.lease_expires_at_ms, 'updated_at_ms', w.updated_at_ms)
   FROM workers w WHERE w.worker_id = :worker_id) AS worker_row,
  (SELECT v.spec_json FROM runs r JOIN task_revisions v ON v.task_id = r.task_id AND v.revision = r.task_revision
   WHERE r.id = :run_id AND :with_revision = 1) AS revision_spec
