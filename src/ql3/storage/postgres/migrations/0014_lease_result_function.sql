-- A lease holder's result (the starting ACK, the running ACK, the completion) in one statement, for
-- the one common case of each (docs/dispatch.md, "Dispatch on PostgreSQL: round trips"): Run,
-- Attempt and lease locked FOR UPDATE in the lock order Run -> Attempt -> lease, the worker read
-- without a lock, as ql3_fence_rows does; then every check application/leases.py makes on those rows
-- (the full fence but the renewal version, the states, the callback token digest and sequence), and
-- only when all of them pass, the writes the Python path would make: the Run and Attempt CAS, the
-- events, for the completion the lease completed with its worker's slot freed, and pg_notify on
-- p_channel (payload p_origin) when the write wakes a loop.
--
-- Anything else answers 'defer' having written nothing (no NOTIFY either): a refused fence, a replay,
-- a late callback, an unusual state, a completion whose project has notification rules (the outbox
-- rows are matched in Python). The caller then runs the statement-by-statement path, which decides
-- and refuses exactly as on SQLite. So this function never has to name an error; it must only never
-- write what the Python path would refuse.
--
-- p_kind: 'starting', 'running' or 'complete'. p_args: for 'running' pid, handle, log_artifact_id,
-- callback_sequence, callback_token_digest; for 'complete' callback_sequence, callback_digest,
-- exit_code. p_event_ids: the ids of the (at most two) events. The event payloads are written as
-- application/runs.py event_payload_json writes them (canonical JSON: sorted keys, no spaces); every
-- value in them is an integer or a fixed status or error code.
-- answer: 'starting', 'running', 'applied' (outcome set) or 'defer'; lease_row: the lease as locked;
-- notified: the channels notified.
CREATE FUNCTION ql3_lease_result(
  p_kind TEXT, p_run_id TEXT, p_attempt_id TEXT, p_worker_id TEXT, p_session_id TEXT,
  p_worker_generation INTEGER, p_lease_generation INTEGER, p_token_digest TEXT, p_args JSONB,
  p_event_ids TEXT[], p_channel TEXT, p_origin TEXT,
  OUT answer TEXT, OUT outcome TEXT, OUT lease_row JSONB, OUT notified TEXT[]
) LANGUAGE plpgsql AS $$
DECLARE
  r runs%ROWTYPE;
  a run_attempts%ROWTYPE;
  l run_leases%ROWTYPE;
  w workers%ROWTYPE;
  now_ms BIGINT := ql3_now_ms();
  spec JSONB;
  deadline BIGINT;
  code TEXT;
  v_exit INTEGER;
  payload TEXT;
BEGIN
  answer := 'defer';
  SELECT * INTO r FROM runs WHERE id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT * INTO a FROM run_attempts WHERE id = p_attempt_id FOR UPDATE;
  IF NOT FOUND OR a.run_id <> r.id THEN
    RETURN;
  END IF;
  SELECT * INTO l FROM run_leases WHERE attempt_id = p_attempt_id FOR UPDATE;
  IF NOT FOUND OR l.run_id <> p_run_id OR l.worker_id <> p_worker_id
      OR l.worker_session_id <> p_session_id OR l.worker_generation <> p_worker_generation
      OR l.lease_generation <> p_lease_generation OR l.lease_token_digest <> p_token_digest
      OR l.status <> 'leased' OR l.expires_at_ms <= now_ms THEN
    RETURN;
  END IF;
  SELECT * INTO w FROM workers WHERE worker_id = p_worker_id;
  IF NOT FOUND OR w.session_id <> p_session_id OR w.generation <> p_worker_generation
      OR w.status NOT IN ('online', 'draining') OR w.lease_expires_at_ms <= now_ms THEN
    RETURN;
  END IF;
  lease_row := to_jsonb(l);
  IF p_kind = 'starting' THEN
    IF a.status <> 'claimed' OR r.status <> 'dispatching' THEN
      RETURN;
    END IF;
    SELECT v.spec_json::jsonb INTO spec FROM task_revisions v
    WHERE v.task_id = r.task_id AND v.revision = r.task_revision;
    IF NOT FOUND THEN
      RETURN;
    END IF;
    IF jsonb_typeof(spec->'timeout_ms') = 'number' THEN
      IF (spec->>'timeout_ms')::NUMERIC <> trunc((spec->>'timeout_ms')::NUMERIC) THEN
        RETURN;  -- not a whole number of milliseconds: Python's validation decides
      END IF;
      deadline := now_ms + (spec->>'timeout_ms')::BIGINT;
    ELSIF spec ? 'timeout_ms' AND jsonb_typeof(spec->'timeout_ms') <> 'null' THEN
      RETURN;
    END IF;
    UPDATE runs SET version = version + 1, event_sequence = r.event_sequence + 1, updated_at_ms = now_ms
    WHERE id = r.id AND version = r.version;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'ql3_lease_result: the locked run moved';
    END IF;
    UPDATE run_attempts SET status = 'starting', deadline_at_ms = deadline
    WHERE id = a.id AND status = 'claimed' AND callback_sequence = a.callback_sequence;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'ql3_lease_result: the locked attempt moved';
    END IF;
    INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,
      payload_json, created_at_ms)
    VALUES (p_event_ids[1], r.id, r.event_sequence + 1, 'attempt.starting', NULL, 'worker', p_worker_id,
      a.id, '{"attempt":' || a.attempt || '}', now_ms);
    IF deadline IS NOT NULL THEN
      PERFORM pg_notify('ql3_' || p_channel, p_origin);
      notified := ARRAY[p_channel];
    END IF;
    answer := 'starting';
    RETURN;
  END IF;
  IF p_kind = 'running' THEN
    IF a.status <> 'starting' OR r.status <> 'dispatching' THEN
      RETURN;
    END IF;
    UPDATE runs SET status = 'running', version = version + 1, event_sequence = r.event_sequence + 2,
      started_at_ms = now_ms, updated_at_ms = now_ms
    WHERE id = r.id AND version = r.version;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'ql3_lease_result: the locked run moved';
    END IF;
    UPDATE run_attempts SET status = 'running', pid = (p_args->>'pid')::INTEGER,
      executor_handle = p_args->>'handle', log_artifact_id = p_args->>'log_artifact_id',
      callback_sequence = (p_args->>'callback_sequence')::INTEGER,
      callback_token_hash = p_args->>'callback_token_digest', started_at_ms = now_ms
    WHERE id = a.id AND status = 'starting' AND callback_sequence = a.callback_sequence;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'ql3_lease_result: the locked attempt moved';
    END IF;
    INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,
      payload_json, created_at_ms)
    VALUES
      (p_event_ids[1], r.id, r.event_sequence + 1, 'attempt.running', NULL, 'worker', p_worker_id, a.id,
       '{"attempt":' || a.attempt || '}', now_ms),
      (p_event_ids[2], r.id, r.event_sequence + 2, 'run.running', 'run-transition:' || r.version || ':running',
       'worker', p_worker_id, a.id, '{"from":"dispatching","to":"running"}', now_ms);
    answer := 'running';
    RETURN;
  END IF;
  IF p_kind <> 'complete' OR a.status <> 'running' OR r.status <> 'running'
      OR a.callback_token_hash IS NULL OR a.callback_token_hash <> p_args->>'callback_digest'
      OR a.callback_sequence <> (p_args->>'callback_sequence')::INTEGER
      OR EXISTS (SELECT 1 FROM notification_rules n WHERE n.project_id = r.project_id) THEN
    RETURN;
  END IF;
  v_exit := (p_args->>'exit_code')::INTEGER;
  IF r.cancel_requested_at_ms IS NOT NULL THEN
    IF r.cancel_reason = 'timeout' THEN
      outcome := 'timed_out';
      code := 'EXECUTION_TIMED_OUT';
    ELSE
      outcome := 'cancelled';
      code := 'EXECUTION_CANCELLED';
    END IF;
  ELSIF v_exit = 0 THEN
    outcome := 'succeeded';
  ELSE
    outcome := 'failed';
    code := 'EXIT_NONZERO';
  END IF;
  payload := '{"attempt":' || a.attempt
    || CASE WHEN code IS NULL THEN '' ELSE ',"error_code":"' || code || '"' END
    || ',"exit_code":' || v_exit || '}';
  UPDATE runs SET status = outcome, version = version + 1, event_sequence = r.event_sequence + 2,
    finished_at_ms = now_ms, exit_code = v_exit, error_code = code,
    updated_at_ms = now_ms
  WHERE id = r.id AND version = r.version;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ql3_lease_result: the locked run moved';
  END IF;
  UPDATE run_attempts SET status = outcome, finished_at_ms = now_ms, exit_code = v_exit,
    error_code = code, callback_sequence = a.callback_sequence + 1
  WHERE id = a.id AND status = 'running' AND callback_sequence = a.callback_sequence;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ql3_lease_result: the locked attempt moved';
  END IF;
  INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,
    payload_json, created_at_ms)
  VALUES
    (p_event_ids[1], r.id, r.event_sequence + 1, 'attempt.' || outcome, NULL, 'worker', p_worker_id, a.id,
     payload, now_ms),
    (p_event_ids[2], r.id, r.event_sequence + 2, 'run.' || outcome,
     'run-transition:' || r.version || ':' || outcome, 'worker', p_worker_id, a.id,
     '{"from":"running","to":"' || outcome || '"}', now_ms);
  UPDATE run_leases SET status = 'completed', version = version + 1, completed_at_ms = now_ms,
    updated_at_ms = now_ms
  WHERE attempt_id = l.attempt_id AND version = l.version AND status = 'leased';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ql3_lease_result: the locked lease moved';
  END IF;
  UPDATE workers SET active_leases = active_leases - 1 WHERE worker_id = l.worker_id;
  PERFORM pg_notify('ql3_' || p_channel, p_origin);
  notified := ARRAY[p_channel];
  answer := 'applied';
END
$$;
