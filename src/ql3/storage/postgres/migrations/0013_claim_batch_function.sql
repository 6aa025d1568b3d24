-- Several claims of one dispatch cycle in one statement (docs/dispatch.md, "Several offers per cycle"):
-- each element of p_claims is one ql3_claim call (migration 0010) with its own fences (the Run and
-- Attempt status checks and CASes, the worker's session, generation, status and lease, the worker's
-- capacity, the lease generation), run in array order in this transaction, so a claim sees the slots
-- the claims before it took. A claim that loses its race answers its reason and writes nothing; it
-- never undoes the others.
--
-- The rows of all the claims are locked first, level by level, each level in one fixed order: the
-- Runs by id, then the Attempts by id, then the workers by id, then the existing lease rows by
-- attempt id. A transaction that takes the rows of one claim (Run -> Attempt -> worker -> lease) and
-- one that takes those of several thus never wait for each other in a cycle; ql3_claim then locks
-- rows this transaction already holds.
--
-- p_claims: [{"run_id", "attempt_id", "worker_id", "session_id", "worker_generation", "generation",
-- "token_digest", "event_id", "payload_json"}, ...]. Answers one row per element, ord its index (from
-- 0), with ql3_claim's answer.
CREATE FUNCTION ql3_claim_batch(p_claims JSONB, p_lease_ms BIGINT)
RETURNS TABLE (
  ord INTEGER, claim_status TEXT, attempt_id TEXT, run_id TEXT, status TEXT, version INTEGER,
  lease_generation INTEGER, worker_id TEXT, worker_session_id TEXT, worker_generation INTEGER,
  lease_token_digest TEXT, acquired_at_ms BIGINT, expires_at_ms BIGINT
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  c JSONB;
  i BIGINT;
BEGIN
  PERFORM 1 FROM runs r
  WHERE r.id IN (SELECT x->>'run_id' FROM jsonb_array_elements(p_claims) x)
  ORDER BY r.id FOR UPDATE;
  PERFORM 1 FROM run_attempts a
  WHERE a.id IN (SELECT x->>'attempt_id' FROM jsonb_array_elements(p_claims) x)
  ORDER BY a.id FOR UPDATE;
  PERFORM 1 FROM workers w
  WHERE w.worker_id IN (SELECT x->>'worker_id' FROM jsonb_array_elements(p_claims) x)
  ORDER BY w.worker_id FOR UPDATE;
  PERFORM 1 FROM run_leases l
  WHERE l.attempt_id IN (SELECT x->>'attempt_id' FROM jsonb_array_elements(p_claims) x)
  ORDER BY l.attempt_id FOR UPDATE;
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
