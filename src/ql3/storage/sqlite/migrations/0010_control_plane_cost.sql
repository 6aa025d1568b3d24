-- The control plane's cost per run on SQLite (bench/README.md, issue 11): fewer b-trees written per
-- run, and the worker's active-lease counter moved by the lease row's own statement instead of a
-- second one (docs/dispatch.md "Worker slots").

-- Every status change of a run wrote three (task, status...) entries: (task_id, status) is the prefix
-- of runs_task_outcome (task_id, status, finished_at_ms), which serves every query it served.
DROP INDEX runs_task_active;

-- Every attempt write (four a run) wrote (status, created_at_ms): no query reads attempts by status
-- in creation order; the ones by status read run_attempts_deadline (status, deadline_at_ms, id).
DROP INDEX run_attempts_status;

-- workers.active_leases counts a worker's run leases in status 'leased'. These triggers move it in the
-- statement that changes the lease row, so it can drift from the rows by no path: +1 when a row is
-- inserted leased or becomes leased, -1 when a leased row ends, both when a leased row changes holder
-- (a claim re-acquiring an expired lease the expiry loop has not ended yet). A statement that changes
-- no row (a CAS that missed) fires nothing.
CREATE TRIGGER run_leases_slot_taken AFTER INSERT ON run_leases
WHEN NEW.status = 'leased'
BEGIN
  UPDATE workers SET active_leases = active_leases + 1 WHERE worker_id = NEW.worker_id;
END;

CREATE TRIGGER run_leases_slot_moved AFTER UPDATE OF status, worker_id ON run_leases
WHEN (OLD.status = 'leased') != (NEW.status = 'leased')
  OR (OLD.status = 'leased' AND OLD.worker_id != NEW.worker_id)
BEGIN
  UPDATE workers SET active_leases = active_leases - 1 WHERE worker_id = OLD.worker_id AND OLD.status = 'leased';
  UPDATE workers SET active_leases = active_leases + 1 WHERE worker_id = NEW.worker_id AND NEW.status = 'leased';
END;
