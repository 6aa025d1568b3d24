-- The whole claim of a queued run in one statement (docs/dispatch.md, "Dispatch on PostgreSQL: round
-- trips"): the same row locks in the same order (Run -> Attempt -> worker -> lease), the same checks,
-- the same writes as application/leases.py runs statement by statement on SQLite, in one round trip.
--
-- p_generation is the lease generation the caller derived p_token_digest for (the raw token never
-- reaches the database). With 1, a first lease is inserted; when the attempt already has a lease row
-- that may be reacquired, nothing is written and the answer is 'reacquire' with the generation to
-- derive: the caller then calls again, in the same transaction (the locks stay held), with that
-- generation, which must still be the next one under the lease row lock.
--
-- claim_status: 'claimed' (the lease columns are set), 'not_eligible', 'worker_unavailable',
-- 'capacity_exhausted', 'leased', 'reacquire'; 'run_missing' / 'attempt_missing' (the caller raises
-- NotFound) and 'run_conflict' / 'attempt_conflict' (a CAS that matched nothing: the caller raises
-- and its transaction rolls back).
CREATE FUNCTION ql3_claim(
  p_run_id TEXT, p_attempt_id TEXT, p_worker_id TEXT, p_session_id TEXT, p_worker_generation INTEGER,
  p_lease_ms BIGINT, p_generation INTEGER, p_token_digest TEXT, p_event_id TEXT, p_payload_json TEXT,
  OUT claim_status TEXT, OUT attempt_id TEXT, OUT run_id TEXT, OUT status TEXT, OUT version INTEGER,
  OUT lease_generation INTEGER, OUT worker_id TEXT, OUT worker_session_id TEXT,
  OUT worker_generation INTEGER, OUT lease_token_digest TEXT, OUT acquired_at_ms BIGINT,
  OUT expires_at_ms BIGINT
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  r runs%ROWTYPE;
  a run_attempts%ROWTYPE;
  w workers%ROWTYPE;
  l run_leases%ROWTYPE;
  latest TEXT;
  held_by TEXT;
  now_ms BIGINT := ql3_now_ms();
BEGIN
  SELECT * INTO r FROM runs WHERE id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    claim_status := 'run_missing';
    RETURN;
  END IF;
  IF r.status <> 'queued' OR r.cancel_requested_at_ms IS NOT NULL THEN
    claim_status := 'not_eligible';
    RETURN;
  END IF;
  SELECT * INTO a FROM run_attempts WHERE id = p_attempt_id FOR UPDATE;
  IF NOT FOUND THEN
    claim_status := 'attempt_missing';
    RETURN;
  END IF;
  SELECT b.id INTO latest FROM run_attempts b WHERE b.run_id = a.run_id ORDER BY b.attempt DESC LIMIT 1;
  IF a.status <> 'claimed' OR latest IS DISTINCT FROM a.id THEN
    claim_status := 'not_eligible';
    RETURN;
  END IF;
  SELECT * INTO w FROM workers WHERE workers.worker_id = p_worker_id FOR UPDATE;
  IF NOT FOUND OR w.session_id <> p_session_id OR w.generation <> p_worker_generation
      OR w.status <> 'online' OR w.lease_expires_at_ms <= now_ms THEN
    claim_status := 'worker_unavailable';
    RETURN;
  END IF;
  IF w.active_leases >= w.max_concurrent_runs THEN
    claim_status := 'capacity_exhausted';
    RETURN;
  END IF;
  IF p_generation = 1 THEN
    INSERT INTO run_leases (attempt_id, run_id, status, version, lease_generation, worker_id,
      worker_session_id, worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms,
      expires_at_ms, updated_at_ms)
    VALUES (p_attempt_id, p_run_id, 'leased', 0, 1, p_worker_id, p_session_id, p_worker_generation,
      p_token_digest, now_ms, now_ms, now_ms + p_lease_ms, now_ms)
    ON CONFLICT ON CONSTRAINT run_leases_pkey DO NOTHING
    RETURNING * INTO l;
  END IF;
  IF p_generation <> 1 OR l.attempt_id IS NULL THEN
    SELECT * INTO l FROM run_leases WHERE run_leases.attempt_id = p_attempt_id FOR UPDATE;
    IF NOT FOUND THEN
      claim_status := 'leased';  -- the conflicting row vanished: a concurrent writer
      RETURN;
    END IF;
    IF l.status = 'completed' THEN
      claim_status := 'not_eligible';
      RETURN;
    END IF;
    IF l.status = 'leased' AND l.expires_at_ms > now_ms THEN
      claim_status := 'leased';
      RETURN;
    END IF;
    IF p_generation = 1 THEN
      claim_status := 'reacquire';
      lease_generation := l.lease_generation + 1;
      RETURN;
    END IF;
    IF l.lease_generation + 1 <> p_generation THEN
      claim_status := 'leased';  -- reacquired by someone else since the caller derived its token
      RETURN;
    END IF;
    -- An expired lease the expiry loop has not ended yet still counts in its holder's slots.
    held_by := CASE WHEN l.status = 'leased' THEN l.worker_id END;
    UPDATE run_leases SET status = 'leased', version = run_leases.version + 1,
      lease_generation = run_leases.lease_generation + 1, worker_id = p_worker_id,
      worker_session_id = p_session_id, worker_generation = p_worker_generation,
      lease_token_digest = p_token_digest, acquired_at_ms = now_ms, renewed_at_ms = now_ms,
      expires_at_ms = now_ms + p_lease_ms, released_at_ms = NULL, release_reason = NULL,
      completed_at_ms = NULL, updated_at_ms = now_ms
    WHERE run_leases.attempt_id = p_attempt_id AND run_leases.version = l.version
    RETURNING * INTO l;
    IF NOT FOUND THEN
      claim_status := 'leased';
      RETURN;
    END IF;
    IF held_by IS NOT NULL THEN
      -- Its slot ends with it, in this transaction, after the lease CAS succeeded (a lost race
      -- moves nothing); as leases.claim does on SQLite.
      UPDATE workers SET active_leases = active_leases - 1 WHERE workers.worker_id = held_by;
    END IF;
  END IF;
  UPDATE workers SET active_leases = active_leases + 1 WHERE workers.worker_id = p_worker_id;
  UPDATE runs SET status = 'dispatching', version = runs.version + 1, event_sequence = r.event_sequence + 1,
    updated_at_ms = now_ms
  WHERE id = p_run_id AND runs.version = r.version;
  IF NOT FOUND THEN
    claim_status := 'run_conflict';
    RETURN;
  END IF;
  UPDATE run_attempts SET worker_id = p_worker_id
  WHERE id = p_attempt_id AND run_attempts.status = 'claimed' AND callback_sequence = a.callback_sequence;
  IF NOT FOUND THEN
    claim_status := 'attempt_conflict';
    RETURN;
  END IF;
  INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,
    payload_json, created_at_ms)
  VALUES (p_event_id, p_run_id, r.event_sequence + 1, 'run.dispatching',
    'run-transition:' || r.version || ':dispatching', 'system', NULL, p_attempt_id, p_payload_json, now_ms);
  claim_status := 'claimed';
  attempt_id := l.attempt_id;
  run_id := l.run_id;
  status := l.status;
  version := l.version;
  lease_generation := l.lease_generation;
  worker_id := l.worker_id;
  worker_session_id := l.worker_session_id;
  worker_generation := l.worker_generation;
  lease_token_digest := l.lease_token_digest;
  acquired_at_ms := l.acquired_at_ms;
  expires_at_ms := l.expires_at_ms;
END
$$;
