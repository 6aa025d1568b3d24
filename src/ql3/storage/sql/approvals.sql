-- Approvals and approved actions (docs/contracts.md §10). Locked reads (``*_lock``) live in the dialect
-- files.

-- name: approval_principal_get
-- desc: A principal's kind, owner flag, disabled time and expiry, to check who may request or decide an approval.
SELECT id, name, kind, is_owner, created_at_ms, disabled_at_ms, expires_at_ms FROM principals WHERE id = :id

-- name: principal_issuer
-- desc: Who issued a principal's current token (NULL: the server, or unknown), for the separation of duty.
SELECT issued_by FROM principals WHERE id = :id

-- name: approval_policy_get
-- desc: A project's approval policy (no row: the default).
SELECT project_id, second_admin, version, updated_by, updated_at_ms FROM approval_policies
WHERE project_id = :project_id

-- name: approval_policy_upsert
-- desc: Creates or replaces a project's approval policy, bumping its version.
INSERT INTO approval_policies (project_id, second_admin, version, updated_by, updated_at_ms)
VALUES (:project_id, :second_admin, 1, :updated_by, :now)
ON CONFLICT (project_id) DO UPDATE SET second_admin = excluded.second_admin,
  version = approval_policies.version + 1, updated_by = excluded.updated_by, updated_at_ms = excluded.updated_at_ms

-- name: approval_insert
-- desc: Creates a pending approval request at version 1; no row when the id is taken.
INSERT INTO approval_requests (id, project_id, version, state, permission, action_type, action_ref, action_digest,
  action_plan_json, preview_digest, risk, requested_by, requested_at_ms, expires_at_ms, request_fence,
  request_digest, updated_at_ms)
VALUES (:id, :project_id, 1, 'pending', :permission, :action_type, :action_ref, :action_digest, :action_plan_json,
  :preview_digest, :risk, :requested_by, :now, :expires_at_ms, :request_fence, :request_digest, :now)
ON CONFLICT DO NOTHING

-- name: approval_get
-- desc: One approval request by id, unlocked.
SELECT * FROM approval_requests WHERE id = :id

-- name: approval_get_in_project
-- desc: One approval request by id only if it belongs to the project.
SELECT * FROM approval_requests WHERE id = :id AND project_id = :project_id

-- name: approval_decide
-- desc: Approves or rejects a pending, unexpired request (version 1 to 2); no row when it was decided or expired.
UPDATE approval_requests SET state = :state, version = 2, decision_id = :decision_id, decision = :decision,
  reason_code = :reason_code, decision_note = :decision_note, decided_by = :decided_by, decided_at_ms = :now,
  decision_fence = :decision_fence, updated_at_ms = :now
WHERE id = :id AND state = 'pending' AND version = 1 AND expires_at_ms > :now

-- name: approval_consume
-- desc: Consumes an approved, unexpired request into a dispatch (version 2 to 3), checking the action digest.
UPDATE approval_requests SET state = 'consumed', version = 3, consumption_id = :consumption_id,
  dispatch_id = :dispatch_id, consumed_by = :consumed_by, consumed_at_ms = :now,
  consumption_fence = :consumption_fence, updated_at_ms = :now
WHERE id = :id AND state = 'approved' AND version = 2 AND expires_at_ms > :now AND action_digest = :action_digest

-- name: approval_list_first
-- desc: The first page of a project's approval requests, newest first.
SELECT * FROM approval_requests WHERE project_id = :project_id
ORDER BY requested_at_ms DESC, id DESC LIMIT :limit

-- name: approval_list_after
-- desc: The next page of a project's approval requests, newest first, before the cursor.
SELECT * FROM approval_requests WHERE project_id = :project_id
  AND (requested_at_ms < :cursor_ms OR (requested_at_ms = :cursor_ms AND id < :cursor_id))
ORDER BY requested_at_ms DESC, id DESC LIMIT :limit

-- name: approval_list_state_first
-- desc: The first page of a project's approval requests in one state, newest first.
SELECT * FROM approval_requests WHERE project_id = :project_id AND state = :state
ORDER BY requested_at_ms DESC, id DESC LIMIT :limit

-- name: approval_list_state_after
-- desc: The next page of a project's approval requests in one state, before the cursor.
SELECT * FROM approval_requests WHERE project_id = :project_id AND state = :state
  AND (requested_at_ms < :cursor_ms OR (requested_at_ms = :cursor_ms AND id < :cursor_id))
ORDER BY requested_at_ms DESC, id DESC LIMIT :limit

-- name: approval_unconsumed_page
-- desc: Approved requests neither expired nor consumed, oldest decision first, for the loop that consumes them.
SELECT id FROM approval_requests WHERE state = 'approved' AND expires_at_ms > :now
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'approval' AND k.item_key = approval_requests.id
    AND k.next_retry_at_ms > :now)
ORDER BY decided_at_ms, id LIMIT :limit

-- name: aa_dispatch_insert
-- desc: Stores the immutable dispatch of a consumed approval: the action, its plan, the approvers and the fence.
INSERT INTO approved_action_dispatches (id, approval_request_id, approval_request_version, project_id, action_type,
  action_ref, action_digest, action_plan_json, requested_by, consumed_by, approved_by, approved_at_ms,
  expires_at_ms, approval_fence, dispatch_digest, created_at_ms)
VALUES (:id, :approval_request_id, 3, :project_id, :action_type, :action_ref, :action_digest, :action_plan_json,
  :requested_by, :consumed_by, :approved_by, :approved_at_ms, :expires_at_ms, :approval_fence, :dispatch_digest,
  :now)

-- name: aa_dispatch_get
-- desc: One approved-action dispatch by id.
SELECT * FROM approved_action_dispatches WHERE id = :id

-- name: aa_execution_insert
-- desc: Creates a dispatch's execution row in pending with its attempt budget.
INSERT INTO approved_action_executions (dispatch_id, dispatch_digest, project_id, status, version, attempt_count,
  max_attempts, eligible_at_ms, created_at_ms, updated_at_ms, execution_digest)
VALUES (:dispatch_id, :dispatch_digest, :project_id, 'pending', 0, 0, :max_attempts, :now, :now, :now,
  :execution_digest)

-- name: aa_execution_get
-- desc: A dispatch's execution row, unlocked.
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id

-- name: aa_execution_claim
-- desc: Leases an eligible execution to a runner (CAS on version, within the attempt budget), counting the attempt.
UPDATE approved_action_executions SET status = 'leased', version = version + 1, attempt_count = attempt_count + 1,
  eligible_at_ms = :lease_expires_at_ms, next_attempt_at_ms = NULL, lease_owner = :lease_owner,
  lease_token_digest = :lease_token_digest, lease_expires_at_ms = :lease_expires_at_ms, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status IN ('pending', 'retry_wait', 'leased')
  AND eligible_at_ms <= :now AND attempt_count < max_attempts

-- name: aa_execution_renew_leased
-- desc: Extends a leased (not yet started) execution's lease and eligibility, CAS on version, while live.
UPDATE approved_action_executions SET version = version + 1, lease_expires_at_ms = :lease_expires_at_ms,
  eligible_at_ms = :lease_expires_at_ms, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'leased'
  AND lease_expires_at_ms > :now

-- name: aa_execution_renew_executing
-- desc: Extends an executing action's lease, CAS on version, while the lease is still live.
UPDATE approved_action_executions SET version = version + 1, lease_expires_at_ms = :lease_expires_at_ms,
  updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'executing'
  AND lease_expires_at_ms > :now

-- name: aa_execution_start
-- desc: The durable start barrier: moves a live leased execution to executing; after this it never runs again by itself.
UPDATE approved_action_executions SET status = 'executing', version = version + 1, eligible_at_ms = NULL,
  started_at_ms = :now, result_mutation_id = NULL, result_code = NULL, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'leased'
  AND updated_at_ms <= :now AND lease_expires_at_ms > :now

-- name: aa_execution_release
-- desc: Ends a not-yet-started execution (retry wait or final state) and drops its lease, CAS on version.
UPDATE approved_action_executions SET status = :status, version = version + 1, eligible_at_ms = :next_attempt_at_ms,
  next_attempt_at_ms = :next_attempt_at_ms, lease_owner = NULL, lease_token_digest = NULL,
  lease_expires_at_ms = NULL, result_mutation_id = :result_mutation_id, result_code = :result_code,
  completed_at_ms = :completed_at_ms, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status IN ('pending', 'leased', 'retry_wait')

-- name: aa_execution_finish
-- desc: Records an executing action's result and final status and drops its lease, CAS on version.
UPDATE approved_action_executions SET status = :status, version = version + 1, eligible_at_ms = NULL,
  next_attempt_at_ms = NULL, lease_owner = NULL, lease_token_digest = NULL, lease_expires_at_ms = NULL,
  result_mutation_id = :result_mutation_id, result_code = :result_code, result_digest = :result_digest,
  completed_at_ms = :now, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'executing'

-- name: aa_due_first
-- desc: The first page of executions eligible to be claimed now, earliest first.
SELECT dispatch_id, eligible_at_ms FROM approved_action_executions
WHERE eligible_at_ms IS NOT NULL AND eligible_at_ms <= :now AND status IN ('pending', 'retry_wait', 'leased')
ORDER BY eligible_at_ms, dispatch_id LIMIT :limit

-- name: aa_due_after
-- desc: The next page of eligible executions after the (eligible_at_ms, dispatch_id) cursor.
SELECT dispatch_id, eligible_at_ms FROM approved_action_executions
WHERE eligible_at_ms IS NOT NULL AND eligible_at_ms <= :now AND status IN ('pending', 'retry_wait', 'leased')
  AND (eligible_at_ms > :c_eligible OR (eligible_at_ms = :c_eligible AND dispatch_id > :c_id))
ORDER BY eligible_at_ms, dispatch_id LIMIT :limit

-- name: aa_recovery_insert
-- desc: Arms the recovery control of an execution as it starts, with its first scan time.
INSERT INTO approved_action_recovery (dispatch_id, project_id, status, version, execution_version, next_scan_at_ms,
  scan_count, armed_at_ms, updated_at_ms)
VALUES (:dispatch_id, :project_id, 'armed', 0, :execution_version, :next_scan_at_ms, 0, :now, :now)

-- name: aa_recovery_on_renew
-- desc: On a renewed execution: bumps the control, revokes any resolver lease, reschedules an armed scan.
UPDATE approved_action_recovery SET version = version + 1, execution_version = :execution_version,
  next_scan_at_ms = CASE WHEN status = 'armed' THEN :next_scan_at_ms ELSE next_scan_at_ms END,
  resolver_owner = NULL, resolver_token_digest = NULL, resolver_lease_expires_at_ms = NULL, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND status IN ('armed', 'manual')

-- name: aa_recovery_due_first
-- desc: Armed controls due for a scan whose execution is executing with a lapsed lease and no live resolver.
SELECT c.dispatch_id, c.next_scan_at_ms FROM approved_action_recovery c
JOIN approved_action_executions e ON e.dispatch_id = c.dispatch_id
WHERE c.status = 'armed' AND c.next_scan_at_ms <= :now
  AND (c.resolver_lease_expires_at_ms IS NULL OR c.resolver_lease_expires_at_ms <= :now)
  AND e.status = 'executing' AND e.lease_expires_at_ms <= :now
ORDER BY c.next_scan_at_ms, c.dispatch_id LIMIT :limit

-- name: aa_recovery_acquire
-- desc: Takes the resolver lease of an armed control and counts the scan, CAS on version and armed status.
UPDATE approved_action_recovery SET version = version + 1, scan_count = scan_count + 1,
  resolver_owner = :resolver_owner, resolver_token_digest = :resolver_token_digest,
  resolver_lease_expires_at_ms = :resolver_lease_expires_at_ms, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'armed'

-- name: aa_recovery_finding
-- desc: Records a scan's finding and the next scan time and drops the resolver lease, under the resolver's token.
UPDATE approved_action_recovery SET version = version + 1, last_finding = :last_finding,
  next_scan_at_ms = :next_scan_at_ms, resolver_owner = NULL, resolver_token_digest = NULL,
  resolver_lease_expires_at_ms = NULL, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'armed'
  AND resolver_token_digest = :resolver_token_digest

-- name: aa_recovery_to_manual
-- desc: Hands an armed control to a person (manual) with its finding, under the resolver's token.
UPDATE approved_action_recovery SET status = 'manual', version = version + 1, last_finding = :last_finding,
  next_scan_at_ms = NULL, resolver_owner = NULL, resolver_token_digest = NULL,
  resolver_lease_expires_at_ms = NULL, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND version = :expected_version AND status = 'armed'
  AND resolver_token_digest = :resolver_token_digest

-- name: aa_recovery_resolve
-- desc: Closes an armed or manual control as resolved with its evidence digest and resolution mutation id.
UPDATE approved_action_recovery SET status = 'resolved', version = version + 1,
  last_finding = COALESCE(:last_finding, last_finding), evidence_digest = :evidence_digest,
  resolution_mutation_id = :resolution_mutation_id, next_scan_at_ms = NULL, resolver_owner = NULL,
  resolver_token_digest = NULL, resolver_lease_expires_at_ms = NULL, updated_at_ms = :now
WHERE dispatch_id = :dispatch_id AND status IN ('armed', 'manual')

-- name: aa_resolution_insert
-- desc: Stores the one resolution of an executing action (automatic or manual), with actor and evidence.
INSERT INTO approved_action_resolutions (dispatch_id, project_id, mutation_id, expected_execution_version, source,
  resolution, outcome, actor_type, actor_id, actor_role, reason_code, evidence_digest, created_at_ms)
VALUES (:dispatch_id, :project_id, :mutation_id, :expected_execution_version, :source, :resolution, :outcome,
  :actor_type, :actor_id, :actor_role, :reason_code, :evidence_digest, :now)

-- name: aa_resolution_get
-- desc: The resolution recorded for a dispatch, if any, to answer a repeated resolve.
SELECT * FROM approved_action_resolutions WHERE dispatch_id = :dispatch_id

-- name: aa_receipt_insert
-- desc: Stores the receipt of a run.create action, written in the transaction that creates the run.
INSERT INTO approved_run_action_receipts (dispatch_id, schema_version, approval_request_id, project_id, action_type,
  action_digest, execution_attempt, execution_version, started_at_ms, idempotency_key, outcome, result_code,
  resource_type, resource_id, finished_at_ms, created_at_ms, evidence_digest)
VALUES (:dispatch_id, :schema_version, :approval_request_id, :project_id, :action_type, :action_digest,
  :execution_attempt, :execution_version, :started_at_ms, :idempotency_key, :outcome, :result_code,
  :resource_type, :resource_id, :finished_at_ms, :created_at_ms, :evidence_digest)

-- name: aa_receipt_get
-- desc: The run.create receipt of a dispatch: the evidence recovery uses to close an interrupted action.
SELECT * FROM approved_run_action_receipts WHERE dispatch_id = :dispatch_id

-- name: aa_action_list_first
-- desc: First page of a project's approved actions with dispatch and recovery fields, newest first.
SELECT e.*, d.approval_request_id, d.action_type, d.action_ref, d.action_digest,
  c.status AS recovery_status, c.last_finding AS recovery_last_finding, c.next_scan_at_ms AS recovery_next_scan_at_ms
FROM approved_action_executions e
JOIN approved_action_dispatches d ON d.id = e.dispatch_id
LEFT JOIN approved_action_recovery c ON c.dispatch_id = e.dispatch_id
WHERE e.project_id = :project_id
ORDER BY e.created_at_ms DESC, e.dispatch_id DESC LIMIT :limit

-- name: aa_action_list_after
-- desc: Next page of a project's approved actions with dispatch and recovery fields, before the cursor.
SELECT e.*, d.approval_request_id, d.action_type, d.action_ref, d.action_digest,
  c.status AS recovery_status, c.last_finding AS recovery_last_finding, c.next_scan_at_ms AS recovery_next_scan_at_ms
FROM approved_action_executions e
JOIN approved_action_dispatches d ON d.id = e.dispatch_id
LEFT JOIN approved_action_recovery c ON c.dispatch_id = e.dispatch_id
WHERE e.project_id = :project_id
  AND (e.created_at_ms < :cursor_ms OR (e.created_at_ms = :cursor_ms AND e.dispatch_id < :cursor_id))
ORDER BY e.created_at_ms DESC, e.dispatch_id DESC LIMIT :limit

-- name: aa_action_get
-- desc: One approved action of a project with its dispatch and recovery fields, for the read model.
SELECT e.*, d.approval_request_id, d.action_type, d.action_ref, d.action_digest,
  c.status AS recovery_status, c.last_finding AS recovery_last_finding, c.next_scan_at_ms AS recovery_next_scan_at_ms
FROM approved_action_executions e
JOIN approved_action_dispatches d ON d.id = e.dispatch_id
LEFT JOIN approved_action_recovery c ON c.dispatch_id = e.dispatch_id
WHERE e.project_id = :project_id AND e.dispatch_id = :dispatch_id
