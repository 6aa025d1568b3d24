-- Two indexes that every run's writes maintained and no query needs (SQLite dropped them in its
-- migration 0010; bench/README.md, issue 11).

-- (task_id, status) is the prefix of runs_task_outcome (task_id, status, finished_at_ms), which serves
-- every query it served; each status change of a run wrote an entry in both.
DROP INDEX runs_task_active;

-- No query reads attempts by status in creation order; the ones by status use run_attempts_deadline
-- (status, deadline_at_ms, id). Every attempt write (four a run) wrote an entry.
DROP INDEX run_attempts_status;
