-- dialect-only: calls of the server-side functions (migrations 0010, 0011, 0013, 0014, 0015); SQLite runs the same steps as separate shared statements.

-- The whole claim in one statement: migration 0010's ql3_claim (application/lease_claims.py runs the same
-- claim as separate statements on SQLite, which has no server-side functions).
-- name: lease_claim
-- desc: The whole claim (locks, checks, lease, slot, run, event) in one call of ql3_claim; answers the outcome.
SELECT * FROM ql3_claim(:run_id, :attempt_id, :worker_id, :session_id, :worker_generation, :lease_ms,
  :generation, :lease_token_digest, :event_id, :payload_json)

-- One Run change (Run CAS, optional Attempt CAS, events) in one statement: migration 0011's
-- ql3_write_run (application/runs.py runs run_cas, attempt_cas and event_insert on SQLite).
-- name: run_write
-- desc: One Run change (Run CAS, optional Attempt CAS, events) in one call of ql3_write_run; answers the outcome.
SELECT ql3_write_run(:run_json::jsonb, :attempt_json::jsonb, :events_json::jsonb) AS outcome

-- The same claim for a unit that ends with it: migration 0015's ql3_claim_or_raise, sent with BEGIN
-- and COMMIT in one round trip (the two conflict answers raise, so the COMMIT cannot keep them).
-- name: lease_claim_last
-- desc: The whole claim in one call of ql3_claim_or_raise (ql3_claim; a CAS conflict raises); answers the outcome.
SELECT * FROM ql3_claim_or_raise(:run_id, :attempt_id, :worker_id, :session_id, :worker_generation,
  :lease_ms, :generation, :lease_token_digest, :event_id, :payload_json)

-- Several claims of one dispatch cycle in one statement: migration 0013's ql3_claim_batch (on SQLite
-- lease_claims.claim_many runs lease_claims.claim once per claim in the same transaction).
-- name: lease_claim_batch
-- desc: Several claims in one call of ql3_claim_batch (all their rows locked level by level first); one answer row each.
SELECT * FROM ql3_claim_batch(:claims_json::jsonb, :lease_ms) ORDER BY ord

-- A lease holder's result (starting ACK, running ACK, completion) in one statement for its common
-- case: migration 0014's ql3_lease_result; 'defer' sends the caller down the statement-by-statement
-- path of application/lease_results.py (the only path on SQLite). Sent with BEGIN and COMMIT in one round
-- trip (PostgresTransaction.one_then_commit, which fills in the origin).
-- name: lease_result
-- desc: A lease holder's result (fence, states, writes) in one call of ql3_lease_result; answers the outcome or 'defer'.
SELECT * FROM ql3_lease_result(:kind, :run_id, :attempt_id, :worker_id, :session_id, :worker_generation,
  :lease_generation, :token_digest, :args_json::jsonb, :event_ids, :channel, :origin)
