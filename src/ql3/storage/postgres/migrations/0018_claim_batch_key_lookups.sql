-- ql3_claim_batch (migration 0013) with its four locking levels as key lookups (docs/dispatch.md,
-- "Several offers per cycle"; bench/README.md, issue 11). Everything else is unchanged: the same rows
-- locked in the same order, level by level (each level's ids sorted, as ORDER BY sorted the rows),
-- then each claim in array order.
--
-- Migration 0013 selected each level with `id IN (SELECT x->>'run_id' FROM jsonb_array_elements(...))`.
-- The planner cannot see inside the JSON array, estimates it at 100 elements, and for a table of a few
-- thousand rows or more chose a hash semi-join over a sequential scan of runs and run_attempts: every
-- dispatch cycle read the whole of both tables, history included (8.7 ms for 20,000 runs here, growing
-- with them). `id = ANY(array)` is no cure either: PL/pgSQL keeps the plan it made while a table was
-- small (a sequential scan) for as long as the connection lives, and run_leases grows by a row a run.
-- One primary-key lookup per id (`WHERE id = k`) is planned as an index scan at every size.
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
  k TEXT;
BEGIN
  FOREACH k IN ARRAY ARRAY(SELECT DISTINCT x->>'run_id' FROM jsonb_array_elements(p_claims) x ORDER BY 1) LOOP
    PERFORM 1 FROM runs r WHERE r.id = k FOR UPDATE;
  END LOOP;
  FOREACH k IN ARRAY ARRAY(SELECT DISTINCT x->>'attempt_id' FROM jsonb_array_elements(p_claims) x ORDER BY 1) LOOP
    PERFORM 1 FROM run_attempts a WHERE a.id = k FOR UPDATE;
  END LOOP;
  FOREACH k IN ARRAY ARRAY(SELECT DISTINCT x->>'worker_id' FROM jsonb_array_elements(p_claims) x ORDER BY 1) LOOP
    PERFORM 1 FROM workers w WHERE w.worker_id = k FOR UPDATE;
  END LOOP;
  FOREACH k IN ARRAY ARRAY(SELECT DISTINCT x->>'attempt_id' FROM jsonb_array_elements(p_claims) x ORDER BY 1) LOOP
    PERFORM 1 FROM run_leases l WHERE l.attempt_id = k FOR UPDATE;
  END LOOP;
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
