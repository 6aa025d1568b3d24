-- The claim of migration 0010 for a unit that sends it with its COMMIT in one round trip
-- (PostgresTransaction.one_then_commit; docs/dispatch.md, "Dispatch on PostgreSQL: round trips").
-- ql3_claim answers 'run_conflict' / 'attempt_conflict' after it has written the lease and the
-- worker's counter, counting on its caller to raise and roll back; a COMMIT already on its way would
-- keep those writes. Here the two answers raise instead, which aborts the transaction (the COMMIT
-- then rolls back): SQLSTATE 23000, which the adapter reports as Conflict. Every other answer
-- writes either the whole claim or nothing, so committing it is what the caller would have done.
CREATE FUNCTION ql3_claim_or_raise(
  p_run_id TEXT, p_attempt_id TEXT, p_worker_id TEXT, p_session_id TEXT, p_worker_generation INTEGER,
  p_lease_ms BIGINT, p_generation INTEGER, p_token_digest TEXT, p_event_id TEXT, p_payload_json TEXT,
  OUT claim_status TEXT, OUT attempt_id TEXT, OUT run_id TEXT, OUT status TEXT, OUT version INTEGER,
  OUT lease_generation INTEGER, OUT worker_id TEXT, OUT worker_session_id TEXT,
  OUT worker_generation INTEGER, OUT lease_token_digest TEXT, OUT acquired_at_ms BIGINT,
  OUT expires_at_ms BIGINT
) LANGUAGE plpgsql AS $$
BEGIN
  SELECT * INTO claim_status, attempt_id, run_id, status, version, lease_generation, worker_id,
    worker_session_id, worker_generation, lease_token_digest, acquired_at_ms, expires_at_ms
  FROM ql3_claim(p_run_id, p_attempt_id, p_worker_id, p_session_id, p_worker_generation, p_lease_ms,
    p_generation, p_token_digest, p_event_id, p_payload_json);
  IF claim_status IN ('run_conflict', 'attempt_conflict') THEN
    RAISE EXCEPTION 'ql3_claim answered %', claim_status USING ERRCODE = 'integrity_constraint_violation';
  END IF;
END
$$;
