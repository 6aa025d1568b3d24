-- One Run change in one statement (docs/dispatch.md, "Dispatch on PostgreSQL: round trips"): the
-- Run CAS on its version, the optional Attempt CAS on its status and callback sequence, and the
-- Run's events, as application/runs.py write_run runs them statement by statement on SQLite. The
-- caller computes every value (the new row, the event ids, sequences and payloads) and checks the
-- transitions; the function answers 'written', or 'run_conflict' / 'attempt_conflict' for a CAS that
-- matched nothing (the caller raises and its transaction rolls back, events included).
CREATE FUNCTION ql3_write_run(p_run JSONB, p_attempt JSONB, p_events JSONB) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
  now_ms BIGINT := ql3_now_ms();
BEGIN
  UPDATE runs SET status = p_run->>'status', version = version + 1,
    event_sequence = (p_run->>'event_sequence')::INTEGER,
    queued_at_ms = (p_run->>'queued_at_ms')::BIGINT, started_at_ms = (p_run->>'started_at_ms')::BIGINT,
    finished_at_ms = (p_run->>'finished_at_ms')::BIGINT,
    cancel_requested_at_ms = (p_run->>'cancel_requested_at_ms')::BIGINT,
    cancel_reason = p_run->>'cancel_reason', error_code = p_run->>'error_code',
    exit_code = (p_run->>'exit_code')::INTEGER, updated_at_ms = now_ms
  WHERE id = p_run->>'id' AND version = (p_run->>'expected_version')::INTEGER;
  IF NOT FOUND THEN
    RETURN 'run_conflict';
  END IF;
  IF p_attempt IS NOT NULL THEN
    UPDATE run_attempts SET status = p_attempt->>'status', worker_id = p_attempt->>'worker_id',
      pid = (p_attempt->>'pid')::INTEGER, executor_handle = p_attempt->>'executor_handle',
      log_artifact_id = p_attempt->>'log_artifact_id',
      deadline_at_ms = (p_attempt->>'deadline_at_ms')::BIGINT,
      callback_token_hash = p_attempt->>'callback_token_hash',
      callback_sequence = (p_attempt->>'callback_sequence')::INTEGER,
      started_at_ms = (p_attempt->>'started_at_ms')::BIGINT,
      finished_at_ms = (p_attempt->>'finished_at_ms')::BIGINT,
      exit_code = (p_attempt->>'exit_code')::INTEGER, error_code = p_attempt->>'error_code'
    WHERE id = p_attempt->>'id' AND status = p_attempt->>'expected_status'
      AND callback_sequence = (p_attempt->>'expected_callback_sequence')::INTEGER;
    IF NOT FOUND THEN
      RETURN 'attempt_conflict';
    END IF;
  END IF;
  INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,
    payload_json, created_at_ms)
  SELECT e->>'id', p_run->>'id', (e->>'sequence')::INTEGER, e->>'type', e->>'dedupe_key',
    e->>'actor_type', e->>'actor_id', e->>'attempt_id', e->>'payload_json', now_ms
  FROM jsonb_array_elements(p_events) WITH ORDINALITY AS x(e, n)
  ORDER BY x.n;
  RETURN 'written';
END
$$;
