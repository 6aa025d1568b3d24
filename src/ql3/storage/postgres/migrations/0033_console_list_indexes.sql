-- Bounded console reads at 10,000 tasks and 1,000,000 runs (bench/README.md "Console at 10,000 tasks
-- and 1,000,000 runs"): the overview's "running now" and a live-status filter read the few live runs
-- through a partial index instead of scanning a project's whole history; one task's runs come in
-- (created_at_ms, id) order from its own index; "next cron fires" reads a project's soonest schedules.
CREATE INDEX runs_project_live ON runs (project_id, created_at_ms, id)
  WHERE status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost');
DROP INDEX runs_task_created;
CREATE INDEX runs_task_created ON runs (task_id, created_at_ms, id);
CREATE INDEX task_schedules_project_due ON task_schedules (project_id, next_fire_at_ms, task_id)
  WHERE next_fire_at_ms IS NOT NULL;
