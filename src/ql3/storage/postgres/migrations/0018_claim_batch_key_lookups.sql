-- ql3_claim_batch (migration 0013) with its four locking statements as key lookups (docs/dispatch.md,
-- "Several offers per cycle"; bench/README.md, issue 11). Everything else is unchanged: the same rows
-- locked in the same order, level by level, then each claim in array order.
--
-- Migration 0013 selected the rows with `id IN (SELECT x->>'run_id' FROM jsonb_array_elements(...))`.
-- The planner cannot see inside the JSON array, estimates it at 100 elements, and for a table of a few
-- thousand rows or more chose a hash semi-join over a sequential scan of runs and run_attempts: every
-- dispatch cycle read the whole of both tables, history included (8.7 ms for 20,000 runs here, growing
-- with them). `id = ANY(ARRAY(...))` is a scan of the primary key for exactly the ids given, in the
-- key's order, whatever the table holds.
CREATE OR REPLACE FUNCTION ql3_claim_batch(p_claims JSONB, p_lease_ms BIGINT)
RETURNS TABLE (
  ord INTEGER, claim_status TEXT, attempt_id TEXT, run_id TEXT, status TEXT, version INTEGER,
  lease_generation INTEGER, worker_id TEXT, worker_session_id TEXT, worker_generation INTEGER,
  lease_token_digest TEXT, acquired_at_ms BIGINT, expires_at_ms BIGINT
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  c JSONB;
  i BIGINT;
  run_ids TEXT[] := ARRAY(SELECT x->>'run_id' FROM jsonb_array_elements(p_claims) x);
  attempt_ids TEXT[] := ARRAY(SELECT x->>'attempt_id' FROM jsonb_array_elements(p_claims) x);
  worker_ids TEXT[] := ARRAY(SELECT x->>'worker_id' FROM jsonb_array_elements(p_claims) x);
BEGIN
  PERFORM 1 FROM runs r WHERE r.id = ANY(run_ids) ORDER BY r.id FOR UPDATE;
  PERFORM 1 FROM run_attempts a WHERE a.id = ANY(attempt_ids) ORDER BY a.id FOR UPDATE;
  PERFORM 1 FROM workers w WHERE w.worker_id = ANY(worker_ids) ORDER BY w.worker_id FOR UPDATE;
  PERFORM 1 FROM run_leases l WHERE l.attempt_id = ANY(attempt_ids) ORDER BY l.attempt_id FOR UPDATE;
  FOR c, i IN SELECT e.value, e.ordinality FROM jsonb_array_elements(p_claims) WITH ORDINALITY e LOOP
    RETURN QUERY
    SELECT (i - 1)::INTEGER, q.claim_status, q.attempt_id, q.run_id, q.status, q.version,
      q.lease_generation, q.worker_id, q.worker_session_id, q.worker_generation,
      q.lease_token_digest, q.acquired_at_ms, q.expires_at_ms
    FROM ql3_claim(c->>'run_id', c->>'attempt_id', c->>'worker_id', c->>'session_id',
      (c->>'worker_generation')::INTEGER, p_lease_ms, (c->>'generation')::INTEGER,
      c->>'token_digest', c->>'event_id', c->>'payload_json') q;
  END LOOP;
END
$$;
