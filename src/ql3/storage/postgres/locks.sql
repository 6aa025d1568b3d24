-- dialect-only: the locked reads, which have no shared text: SELECT ... FOR UPDATE here, a plain read on SQLite.
-- Fixed lock order: Run -> Attempt -> lease/dispatch rows (CancellationDispatch after the Attempt);
-- for approvals: approval -> execution -> recovery control.

-- name: run_lock
-- desc: One Run by id, row-locked until the transaction ends (first in the lock order).
SELECT * FROM runs WHERE id = :id FOR UPDATE

-- name: attempt_lock
-- desc: One Attempt by id, row-locked until the transaction ends (after its Run).
SELECT * FROM run_attempts WHERE id = :id FOR UPDATE

-- name: lease_lock
-- desc: An attempt's lease row, row-locked until the transaction ends (after its Attempt).
SELECT * FROM run_leases WHERE attempt_id = :attempt_id FOR UPDATE

-- name: worker_lock
-- desc: One worker row, row-locked until the transaction ends, for session and slot changes.
SELECT * FROM workers WHERE worker_id = :worker_id FOR UPDATE

-- name: schedule_lock
-- desc: A task's schedule row, row-locked until the transaction ends, so one admitter advances it.
SELECT * FROM task_schedules WHERE task_id = :task_id FOR UPDATE

-- name: cancel_dispatch_lock
-- desc: A run's cancellation dispatch, row-locked until the transaction ends (after the Attempt).
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id FOR UPDATE

-- name: approval_lock
-- desc: One approval request, row-locked until the transaction ends (first in the approval lock order).
SELECT * FROM approval_requests WHERE id = :id FOR UPDATE

-- name: aa_execution_lock
-- desc: An approved action's execution row, row-locked until the transaction ends (after the approval).
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id FOR UPDATE

-- name: aa_recovery_lock
-- desc: An approved action's recovery control, row-locked until the transaction ends (after the execution).
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id FOR UPDATE

-- name: fence_lock
-- desc: ql3_fence_rows (migration 0012): Run, Attempt, lease locked in order, the worker, the pinned spec.
SELECT * FROM ql3_fence_rows(:run_id, :attempt_id, :worker_id, :with_revision)

-- name: schedule_lock_due_page
-- desc: A page of due schedules with their tasks, earliest first, row-locked (rows another admitter holds skipped).
SELECT s.*, t.name AS t__name, t.enabled AS t__enabled, t.revision AS t__revision, t.created_at_ms AS t__created_at_ms,
  t.updated_at_ms AS t__updated_at_ms, t.deleted_at_ms AS t__deleted_at_ms, t.project_id AS t__project_id,
  r.spec_json AS r__spec_json
FROM task_schedules s JOIN tasks t ON t.id = s.task_id
LEFT JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision
WHERE s.next_fire_at_ms IS NOT NULL AND s.next_fire_at_ms <= :now
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'schedule' AND k.item_key = s.task_id
    AND k.next_retry_at_ms > :now)
ORDER BY s.next_fire_at_ms, s.task_id LIMIT :limit
FOR UPDATE OF s SKIP LOCKED

-- name: schedule_move_page
-- desc: Moves a page of cron cursors at once (a JSON array of task id, revision, occurrence, due and last decided).
UPDATE task_schedules s SET task_revision = m.task_revision, next_occurrence_ms = m.next_occurrence_ms,
  next_fire_at_ms = m.next_fire_at_ms, last_scheduled_at_ms = m.last_scheduled_at_ms,
  state_version = s.state_version + 1, updated_at_ms = :now
FROM jsonb_to_recordset(CAST(:moves AS jsonb)) AS m(task_id text, task_revision integer, next_occurrence_ms bigint,
  next_fire_at_ms bigint, last_scheduled_at_ms bigint)
WHERE s.task_id = m.task_id
