-- The rows a lease holder's result is checked against, in one statement (docs/dispatch.md, "Dispatch
-- on PostgreSQL: round trips"): the Run and the Attempt (when p_run_id is given), the attempt's lease
-- row, each locked FOR UPDATE in the lock order Run -> Attempt -> lease that application/leases.py
-- takes statement by statement on SQLite, then the worker row (a plain read, as check_fence reads it)
-- and, when asked, the pinned task revision's spec (a plain read, for the starting ACK's deadline).
-- It only reads and locks: every check (the fence, the states, the CAS) stays in application/leases.py.
-- A missing row answers NULL in its column.
CREATE FUNCTION ql3_fence_rows(p_run_id TEXT, p_attempt_id TEXT, p_worker_id TEXT, p_with_revision BOOLEAN)
RETURNS TABLE (run_row JSONB, attempt_row JSONB, lease_row JSONB, worker_row JSONB, revision_spec TEXT)
LANGUAGE plpgsql AS $$
DECLARE
  r runs%ROWTYPE;
  a run_attempts%ROWTYPE;
  l run_leases%ROWTYPE;
  w workers%ROWTYPE;
BEGIN
  IF p_run_id IS NOT NULL THEN
    SELECT * INTO r FROM runs WHERE id = p_run_id FOR UPDATE;
    IF FOUND THEN
      run_row := to_jsonb(r);
    END IF;
    SELECT * INTO a FROM run_attempts WHERE id = p_attempt_id FOR UPDATE;
    IF FOUND THEN
      attempt_row := to_jsonb(a);
    END IF;
  END IF;
  SELECT * INTO l FROM run_leases WHERE attempt_id = p_attempt_id FOR UPDATE;
  IF FOUND THEN
    lease_row := to_jsonb(l);
  END IF;
  SELECT * INTO w FROM workers WHERE worker_id = p_worker_id;
  IF FOUND THEN
    worker_row := to_jsonb(w);
  END IF;
  IF p_with_revision AND run_row IS NOT NULL THEN
    SELECT v.spec_json INTO revision_spec FROM task_revisions v
    WHERE v.task_id = r.task_id AND v.revision = r.task_revision;
  END IF;
  RETURN NEXT;
END
$$;
