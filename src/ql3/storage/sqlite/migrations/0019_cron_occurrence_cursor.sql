-- The cron cursor keyed by occurrence (docs/cron.md): next_occurrence_ms is the occurrence the cursor
-- waits for (its idempotency key and scheduled_for_ms); next_fire_at_ms stays the instant it is due,
-- the occurrence plus the task's random delay. NULL on a row written before: the two are the same.
ALTER TABLE task_schedules ADD COLUMN next_occurrence_ms INTEGER;
