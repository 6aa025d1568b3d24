COLUMN approval_policies.project_id text null=NO default=None
COLUMN approval_policies.second_admin integer null=NO default=None
COLUMN approval_policies.version integer null=NO default=None
COLUMN approval_policies.updated_by text null=NO default=None
COLUMN approval_policies.updated_at_ms bigint null=NO default=None
COLUMN approval_requests.id text null=NO default=None
COLUMN approval_requests.project_id text null=NO default=None
COLUMN approval_requests.version integer null=NO default=None
COLUMN approval_requests.state text null=NO default=None
COLUMN approval_requests.permission text null=NO default=None
COLUMN approval_requests.action_type text null=NO default=None
COLUMN approval_requests.action_ref text null=NO default=None
COLUMN approval_requests.action_digest text null=NO default=None
COLUMN approval_requests.action_plan_json text null=NO default=None
COLUMN approval_requests.preview_digest text null=NO default=None
COLUMN approval_requests.risk text null=NO default=None
COLUMN approval_requests.requested_by text null=NO default=None
COLUMN approval_requests.requested_at_ms bigint null=NO default=None
COLUMN approval_requests.expires_at_ms bigint null=NO default=None
COLUMN approval_requests.request_fence text null=NO default=None
COLUMN approval_requests.request_digest text null=NO default=None
COLUMN approval_requests.decision_id text null=YES default=None
COLUMN approval_requests.decision text null=YES default=None
COLUMN approval_requests.reason_code text null=YES default=None
COLUMN approval_requests.decided_by text null=YES default=None
COLUMN approval_requests.decided_at_ms bigint null=YES default=None
COLUMN approval_requests.decision_fence text null=YES default=None
COLUMN approval_requests.consumption_id text null=YES default=None
COLUMN approval_requests.dispatch_id text null=YES default=None
COLUMN approval_requests.consumed_by text null=YES default=None
COLUMN approval_requests.consumed_at_ms bigint null=YES default=None
COLUMN approval_requests.consumption_fence text null=YES default=None
COLUMN approval_requests.updated_at_ms bigint null=NO default=None
COLUMN approval_requests.decision_note text null=YES default=None
COLUMN approved_action_dispatches.id text null=NO default=None
COLUMN approved_action_dispatches.approval_request_id text null=NO default=None
COLUMN approved_action_dispatches.approval_request_version integer null=NO default=None
COLUMN approved_action_dispatches.project_id text null=NO default=None
COLUMN approved_action_dispatches.action_type text null=NO default=None
COLUMN approved_action_dispatches.action_ref text null=NO default=None
COLUMN approved_action_dispatches.action_digest text null=NO default=None
COLUMN approved_action_dispatches.action_plan_json text null=NO default=None
COLUMN approved_action_dispatches.requested_by text null=NO default=None
COLUMN approved_action_dispatches.consumed_by text null=NO default=None
COLUMN approved_action_dispatches.approved_by text null=NO default=None
COLUMN approved_action_dispatches.approved_at_ms bigint null=NO default=None
COLUMN approved_action_dispatches.expires_at_ms bigint null=NO default=None
COLUMN approved_action_dispatches.approval_fence text null=NO default=None
COLUMN approved_action_dispatches.dispatch_digest text null=NO default=None
COLUMN approved_action_dispatches.created_at_ms bigint null=NO default=None
COLUMN approved_action_executions.dispatch_id text null=NO default=None
COLUMN approved_action_executions.dispatch_digest text null=NO default=None
COLUMN approved_action_executions.project_id text null=NO default=None
COLUMN approved_action_executions.status text null=NO default=None
COLUMN approved_action_executions.version integer null=NO default=None
COLUMN approved_action_executions.attempt_count integer null=NO default=None
COLUMN approved_action_executions.max_attempts integer null=NO default=None
COLUMN approved_action_executions.eligible_at_ms bigint null=YES default=None
COLUMN approved_action_executions.next_attempt_at_ms bigint null=YES default=None
COLUMN approved_action_executions.lease_owner text null=YES default=None
COLUMN approved_action_executions.lease_token_digest text null=YES default=None
COLUMN approved_action_executions.lease_expires_at_ms bigint null=YES default=None
COLUMN approved_action_executions.started_at_ms bigint null=YES default=None
COLUMN approved_action_executions.result_mutation_id text null=YES default=None
COLUMN approved_action_executions.result_code text null=YES default=None
COLUMN approved_action_executions.result_digest text null=YES default=None
COLUMN approved_action_executions.completed_at_ms bigint null=YES default=None
COLUMN approved_action_executions.created_at_ms bigint null=NO default=None
COLUMN approved_action_executions.updated_at_ms bigint null=NO default=None
COLUMN approved_action_executions.execution_digest text null=NO default=None
COLUMN approved_action_recovery.dispatch_id text null=NO default=None
COLUMN approved_action_recovery.project_id text null=NO default=None
COLUMN approved_action_recovery.status text null=NO default=None
COLUMN approved_action_recovery.version integer null=NO default=None
COLUMN approved_action_recovery.execution_version integer null=NO default=None
COLUMN approved_action_recovery.next_scan_at_ms bigint null=YES default=None
COLUMN approved_action_recovery.resolver_owner text null=YES default=None
COLUMN approved_action_recovery.resolver_token_digest text null=YES default=None
COLUMN approved_action_recovery.resolver_lease_expires_at_ms bigint null=YES default=None
COLUMN approved_action_recovery.last_finding text null=YES default=None
COLUMN approved_action_recovery.scan_count integer null=NO default=None
COLUMN approved_action_recovery.evidence_digest text null=YES default=None
COLUMN approved_action_recovery.resolution_mutation_id text null=YES default=None
COLUMN approved_action_recovery.armed_at_ms bigint null=NO default=None
COLUMN approved_action_recovery.updated_at_ms bigint null=NO default=None
COLUMN approved_action_resolutions.dispatch_id text null=NO default=None
COLUMN approved_action_resolutions.project_id text null=NO default=None
COLUMN approved_action_resolutions.mutation_id text null=NO default=None
COLUMN approved_action_resolutions.expected_execution_version integer null=NO default=None
COLUMN approved_action_resolutions.source text null=NO default=None
COLUMN approved_action_resolutions.resolution text null=NO default=None
COLUMN approved_action_resolutions.outcome text null=NO default=None
COLUMN approved_action_resolutions.actor_type text null=NO default=None
COLUMN approved_action_resolutions.actor_id text null=NO default=None
COLUMN approved_action_resolutions.actor_role text null=YES default=None
COLUMN approved_action_resolutions.reason_code text null=NO default=None
COLUMN approved_action_resolutions.evidence_digest text null=YES default=None
COLUMN approved_action_resolutions.created_at_ms bigint null=NO default=None
COLUMN approved_run_action_receipts.dispatch_id text null=NO default=None
COLUMN approved_run_action_receipts.schema_version integer null=NO default=None
COLUMN approved_run_action_receipts.approval_request_id text null=NO default=None
COLUMN approved_run_action_receipts.project_id text null=NO default=None
COLUMN approved_run_action_receipts.action_type text null=NO default=None
COLUMN approved_run_action_receipts.action_digest text null=NO default=None
COLUMN approved_run_action_receipts.execution_attempt integer null=NO default=None
COLUMN approved_run_action_receipts.execution_version integer null=NO default=None
COLUMN approved_run_action_receipts.started_at_ms bigint null=NO default=None
COLUMN approved_run_action_receipts.idempotency_key text null=NO default=None
COLUMN approved_run_action_receipts.outcome text null=NO default=None
COLUMN approved_run_action_receipts.result_code text null=NO default=None
COLUMN approved_run_action_receipts.resource_type text null=NO default=None
COLUMN approved_run_action_receipts.resource_id text null=NO default=None
COLUMN approved_run_action_receipts.finished_at_ms bigint null=NO default=None
COLUMN approved_run_action_receipts.created_at_ms bigint null=NO default=None
COLUMN approved_run_action_receipts.evidence_digest text null=NO default=None
COLUMN attempt_log_chunks.attempt_id text null=NO default=None
COLUMN attempt_log_chunks.start_offset bigint null=NO default=None
COLUMN attempt_log_chunks.data bytea null=NO default=None
COLUMN attempt_log_chunks.created_at_ms bigint null=NO default=None
COLUMN attempt_logs.attempt_id text null=NO default=None
COLUMN attempt_logs.stored_bytes bigint null=NO default=None
COLUMN attempt_logs.cap_bytes bigint null=NO default=None
COLUMN attempt_logs.truncated_at_ms bigint null=YES default=None
COLUMN attempt_logs.closed_at_ms bigint null=YES default=None
COLUMN attempt_logs.created_at_ms bigint null=NO default=None
COLUMN attempt_logs.updated_at_ms bigint null=NO default=None
COLUMN cancellation_audit.id text null=NO default=None
COLUMN cancellation_audit.project_id text null=NO default=None
COLUMN cancellation_audit.run_id text null=NO default=None
COLUMN cancellation_audit.principal_id text null=NO default=None
COLUMN cancellation_audit.operation text null=NO default=None
COLUMN cancellation_audit.mutation_id text null=NO default=None
COLUMN cancellation_audit.created_at_ms bigint null=NO default=None
COLUMN cancellation_audit.payload_json text null=NO default=None
COLUMN cancellation_dispatches.run_id text null=NO default=None
COLUMN cancellation_dispatches.attempt_id text null=NO default=None
COLUMN cancellation_dispatches.project_id text null=NO default=None
COLUMN cancellation_dispatches.status text null=NO default=None
COLUMN cancellation_dispatches.version integer null=NO default=None
COLUMN cancellation_dispatches.dispatch_count integer null=NO default=None
COLUMN cancellation_dispatches.next_attempt_at_ms bigint null=YES default=None
COLUMN cancellation_dispatches.lease_owner text null=YES default=None
COLUMN cancellation_dispatches.lease_token_digest text null=YES default=None
COLUMN cancellation_dispatches.lease_expires_at_ms bigint null=YES default=None
COLUMN cancellation_dispatches.last_result text null=YES default=None
COLUMN cancellation_dispatches.last_dispatched_at_ms bigint null=YES default=None
COLUMN cancellation_dispatches.created_at_ms bigint null=NO default=None
COLUMN cancellation_dispatches.updated_at_ms bigint null=NO default=None
COLUMN cron_skips.task_id text null=NO default=None
COLUMN cron_skips.occurrence_ms bigint null=NO default=None
COLUMN cron_skips.project_id text null=NO default=None
COLUMN cron_skips.task_revision integer null=NO default=None
COLUMN cron_skips.last_occurrence_ms bigint null=NO default=None
COLUMN cron_skips.occurrences integer null=NO default=None
COLUMN cron_skips.reason text null=NO default=None
COLUMN cron_skips.created_at_ms bigint null=NO default=None
COLUMN cron_start_epoch.singleton integer null=NO default=None
COLUMN cron_start_epoch.epoch integer null=NO default=None
COLUMN cron_start_epoch.running integer null=NO default=None
COLUMN cron_start_epoch.updated_at_ms bigint null=NO default=None
COLUMN notification_channels.id text null=NO default=None
COLUMN notification_channels.project_id text null=NO default=None
COLUMN notification_channels.name text null=NO default=None
COLUMN notification_channels.kind text null=NO default=None
COLUMN notification_channels.target text null=NO default=None
COLUMN notification_channels.secret text null=YES default=None
COLUMN notification_channels.scheme text null=NO default=None
COLUMN notification_channels.created_at_ms bigint null=NO default=None
COLUMN notification_outbox.id text null=NO default=None
COLUMN notification_outbox.project_id text null=NO default=None
COLUMN notification_outbox.channel_id text null=NO default=None
COLUMN notification_outbox.outcome_key text null=NO default=None
COLUMN notification_outbox.event text null=NO default=None
COLUMN notification_outbox.payload_json text null=NO default=None
COLUMN notification_outbox.status text null=NO default=None
COLUMN notification_outbox.attempts integer null=NO default=None
COLUMN notification_outbox.due_at_ms bigint null=YES default=None
COLUMN notification_outbox.lease_owner text null=YES default=None
COLUMN notification_outbox.last_error text null=YES default=None
COLUMN notification_outbox.created_at_ms bigint null=NO default=None
COLUMN notification_outbox.updated_at_ms bigint null=NO default=None
COLUMN notification_rules.id text null=NO default=None
COLUMN notification_rules.project_id text null=NO default=None
COLUMN notification_rules.channel_id text null=NO default=None
COLUMN notification_rules.task_id text null=NO default=None
COLUMN notification_rules.events text null=NO default=None
COLUMN notification_rules.created_at_ms bigint null=NO default=None
COLUMN parked_items.item_kind text null=NO default=None
COLUMN parked_items.item_key text null=NO default=None
COLUMN parked_items.loop text null=NO default=None
COLUMN parked_items.project_id text null=YES default=None
COLUMN parked_items.reason text null=NO default=None
COLUMN parked_items.error_type text null=YES default=None
COLUMN parked_items.failures integer null=NO default=None
COLUMN parked_items.first_failed_at_ms bigint null=NO default=None
COLUMN parked_items.last_failed_at_ms bigint null=NO default=None
COLUMN parked_items.next_retry_at_ms bigint null=NO default=None
COLUMN principals.id text null=NO default=None
COLUMN principals.name text null=NO default=None
COLUMN principals.kind text null=NO default=None
COLUMN principals.is_owner integer null=NO default=0
COLUMN principals.token_digest text null=NO default=None
COLUMN principals.created_at_ms bigint null=NO default=None
COLUMN principals.disabled_at_ms bigint null=YES default=None
COLUMN principals.expires_at_ms bigint null=YES default=None
COLUMN principals.token_issued_at_ms bigint null=YES default=None
COLUMN principals.last_used_at_ms bigint null=YES default=None
COLUMN principals.issued_by text null=YES default=None
COLUMN project_dependencies.project_id text null=NO default=None
COLUMN project_dependencies.kind text null=NO default=None
COLUMN project_dependencies.name text null=NO default=None
COLUMN project_dependencies.spec text null=NO default=None
COLUMN project_dependencies.created_at_ms bigint null=NO default=None
COLUMN project_dependencies.updated_at_ms bigint null=NO default=None
COLUMN project_settings.project_id text null=NO default=None
COLUMN project_settings.default_tz text null=YES default=None
COLUMN project_settings.updated_at_ms bigint null=NO default=None
COLUMN project_variables.project_id text null=NO default=None
COLUMN project_variables.name text null=NO default=None
COLUMN project_variables.value text null=NO default=None
COLUMN project_variables.secret boolean null=NO default=None
COLUMN project_variables.enabled boolean null=NO default=None
COLUMN project_variables.note text null=NO default=None
COLUMN project_variables.created_at_ms bigint null=NO default=None
COLUMN project_variables.updated_at_ms bigint null=NO default=None
COLUMN projects.id text null=NO default=None
COLUMN projects.name text null=NO default=None
COLUMN projects.version bigint null=NO default=None
COLUMN projects.created_at_ms bigint null=NO default=None
COLUMN ql3_clock.singleton boolean null=NO default=true
COLUMN ql3_clock.offset_ms bigint null=NO default=0
COLUMN retention_policies.project_id text null=NO default=None
COLUMN retention_policies.keep_days integer null=YES default=None
COLUMN retention_policies.runs_per_task integer null=YES default=None
COLUMN retention_policies.log_bytes_per_run bigint null=YES default=None
COLUMN retention_policies.log_cursor_ms bigint null=NO default=0
COLUMN retention_policies.log_cursor_id text null=NO default=''::text
COLUMN retention_policies.version integer null=NO default=None
COLUMN retention_policies.updated_at_ms bigint null=NO default=None
COLUMN role_bindings.principal_id text null=NO default=None
COLUMN role_bindings.project_id text null=NO default=None
COLUMN role_bindings.role text null=NO default=None
COLUMN role_bindings.version bigint null=NO default=None
COLUMN run_attempts.id text null=NO default=None
COLUMN run_attempts.run_id text null=NO default=None
COLUMN run_attempts.attempt integer null=NO default=None
COLUMN run_attempts.status text null=NO default=None
COLUMN run_attempts.executor_type text null=NO default=None
COLUMN run_attempts.worker_id text null=YES default=None
COLUMN run_attempts.pid integer null=YES default=None
COLUMN run_attempts.executor_handle text null=YES default=None
COLUMN run_attempts.log_artifact_id text null=YES default=None
COLUMN run_attempts.deadline_at_ms bigint null=YES default=None
COLUMN run_attempts.callback_token_hash text null=YES default=None
COLUMN run_attempts.callback_sequence integer null=NO default=0
COLUMN run_attempts.created_at_ms bigint null=NO default=None
COLUMN run_attempts.started_at_ms bigint null=YES default=None
COLUMN run_attempts.finished_at_ms bigint null=YES default=None
COLUMN run_attempts.exit_code integer null=YES default=None
COLUMN run_attempts.error_code text null=YES default=None
COLUMN run_events.id text null=NO default=None
COLUMN run_events.run_id text null=NO default=None
COLUMN run_events.sequence integer null=NO default=None
COLUMN run_events.type text null=NO default=None
COLUMN run_events.dedupe_key text null=YES default=None
COLUMN run_events.actor_type text null=NO default=None
COLUMN run_events.actor_id text null=YES default=None
COLUMN run_events.attempt_id text null=YES default=None
COLUMN run_events.payload_json text null=NO default=None
COLUMN run_events.created_at_ms bigint null=NO default=None
COLUMN run_leases.attempt_id text null=NO default=None
COLUMN run_leases.run_id text null=NO default=None
COLUMN run_leases.status text null=NO default=None
COLUMN run_leases.version integer null=NO default=None
COLUMN run_leases.lease_generation integer null=NO default=None
COLUMN run_leases.worker_id text null=NO default=None
COLUMN run_leases.worker_session_id text null=NO default=None
COLUMN run_leases.worker_generation integer null=NO default=None
COLUMN run_leases.lease_token_digest text null=NO default=None
COLUMN run_leases.acquired_at_ms bigint null=NO default=None
COLUMN run_leases.renewed_at_ms bigint null=NO default=None
COLUMN run_leases.expires_at_ms bigint null=NO default=None
COLUMN run_leases.released_at_ms bigint null=YES default=None
COLUMN run_leases.release_reason text null=YES default=None
COLUMN run_leases.completed_at_ms bigint null=YES default=None
COLUMN run_leases.updated_at_ms bigint null=NO default=None
COLUMN run_retry_policies.run_id text null=NO default=None
COLUMN run_retry_policies.max_attempts integer null=NO default=None
COLUMN run_retry_policies.retry_on_lost integer null=NO default=None
COLUMN run_retry_policies.safety text null=NO default=None
COLUMN run_retry_policies.backoff_min_ms bigint null=NO default=None
COLUMN run_retry_policies.backoff_max_ms bigint null=NO default=None
COLUMN run_retry_policies.next_retry_at_ms bigint null=YES default=None
COLUMN run_retry_policies.version integer null=NO default=None
COLUMN runs.id text null=NO default=None
COLUMN runs.project_id text null=NO default=None
COLUMN runs.task_id text null=NO default=None
COLUMN runs.task_revision integer null=NO default=None
COLUMN runs.trigger_type text null=NO default=None
COLUMN runs.trigger_id text null=YES default=None
COLUMN runs.status text null=NO default=None
COLUMN runs.version integer null=NO default=None
COLUMN runs.event_sequence integer null=NO default=None
COLUMN runs.priority integer null=NO default=0
COLUMN runs.idempotency_key text null=YES default=None
COLUMN runs.request_id text null=YES default=None
COLUMN runs.retry_of_run_id text null=YES default=None
COLUMN runs.scheduled_for_ms bigint null=YES default=None
COLUMN runs.created_at_ms bigint null=NO default=None
COLUMN runs.queued_at_ms bigint null=YES default=None
COLUMN runs.started_at_ms bigint null=YES default=None
COLUMN runs.finished_at_ms bigint null=YES default=None
COLUMN runs.cancel_requested_at_ms bigint null=YES default=None
COLUMN runs.cancel_reason text null=YES default=None
COLUMN runs.error_code text null=YES default=None
COLUMN runs.exit_code integer null=YES default=None
COLUMN runs.updated_at_ms bigint null=NO default=None
COLUMN runs.request_digest text null=YES default=None
COLUMN script_revisions.project_id text null=NO default=None
COLUMN script_revisions.path text null=NO default=None
COLUMN script_revisions.revision integer null=NO default=None
COLUMN script_revisions.content text null=YES default=None
COLUMN script_revisions.digest text null=YES default=None
COLUMN script_revisions.author text null=NO default=None
COLUMN script_revisions.source text null=NO default=None
COLUMN script_revisions.created_at_ms bigint null=NO default=None
COLUMN scripts.project_id text null=NO default=None
COLUMN scripts.path text null=NO default=None
COLUMN scripts.revision integer null=NO default=None
COLUMN scripts.digest text null=NO default=None
COLUMN scripts.size_bytes integer null=NO default=None
COLUMN scripts.updated_at_ms bigint null=NO default=None
COLUMN scripts.updated_by text null=NO default=None
COLUMN server_keys.name text null=NO default=None
COLUMN server_keys.key_hex text null=NO default=None
COLUMN server_keys.created_at_ms bigint null=NO default=None
COLUMN subscription_files.subscription_id text null=NO default=None
COLUMN subscription_files.path text null=NO default=None
COLUMN subscription_files.task_id text null=YES default=None
COLUMN subscription_syncs.id text null=NO default=None
COLUMN subscription_syncs.subscription_id text null=NO default=None
COLUMN subscription_syncs.project_id text null=NO default=None
COLUMN subscription_syncs.trigger_type text null=NO default=None
COLUMN subscription_syncs.status text null=NO default=None
COLUMN subscription_syncs.commit_sha text null=YES default=None
COLUMN subscription_syncs.summary text null=YES default=None
COLUMN subscription_syncs.log text null=NO default=None
COLUMN subscription_syncs.started_at_ms bigint null=NO default=None
COLUMN subscription_syncs.ended_at_ms bigint null=YES default=None
COLUMN subscription_syncs.run_id text null=YES default=None
COLUMN subscriptions.id text null=NO default=None
COLUMN subscriptions.project_id text null=NO default=None
COLUMN subscriptions.name text null=NO default=None
COLUMN subscriptions.repo_url text null=NO default=None
COLUMN subscriptions.branch text null=YES default=None
COLUMN subscriptions.path_glob text null=YES default=None
COLUMN subscriptions.cron text null=YES default=None
COLUMN subscriptions.deploy_key text null=YES default=None
COLUMN subscriptions.next_sync_at_ms bigint null=YES default=None
COLUMN subscriptions.created_at_ms bigint null=NO default=None
COLUMN task_revisions.task_id text null=NO default=None
COLUMN task_revisions.revision integer null=NO default=None
COLUMN task_revisions.spec_json text null=NO default=None
COLUMN task_revisions.content_digest text null=NO default=None
COLUMN task_revisions.created_at_ms bigint null=NO default=None
COLUMN task_schedules.task_id text null=NO default=None
COLUMN task_schedules.project_id text null=NO default=None
COLUMN task_schedules.task_revision integer null=NO default=None
COLUMN task_schedules.cron_expr text null=NO default=None
COLUMN task_schedules.next_fire_at_ms bigint null=YES default=None
COLUMN task_schedules.last_scheduled_at_ms bigint null=YES default=None
COLUMN task_schedules.state_version integer null=NO default=None
COLUMN task_schedules.updated_at_ms bigint null=NO default=None
COLUMN task_schedules.next_occurrence_ms bigint null=YES default=None
COLUMN tasks.id text null=NO default=None
COLUMN tasks.project_id text null=NO default=None
COLUMN tasks.name text null=NO default=None
COLUMN tasks.enabled integer null=NO default=None
COLUMN tasks.revision integer null=NO default=None
COLUMN tasks.created_at_ms bigint null=NO default=None
COLUMN tasks.updated_at_ms bigint null=NO default=None
COLUMN tasks.deleted_at_ms bigint null=YES default=None
COLUMN user_logins.principal_id text null=NO default=None
COLUMN user_logins.login text null=NO default=None
COLUMN user_logins.password_hash text null=NO default=None
COLUMN user_logins.totp_sealed text null=YES default=None
COLUMN user_logins.totp_last_step bigint null=YES default=None
COLUMN user_logins.failed_count integer null=NO default=0
COLUMN user_logins.locked_until_ms bigint null=YES default=None
COLUMN user_logins.created_at_ms bigint null=NO default=None
COLUMN user_logins.updated_at_ms bigint null=NO default=None
COLUMN user_sessions.id text null=NO default=None
COLUMN user_sessions.principal_id text null=NO default=None
COLUMN user_sessions.secret_digest text null=NO default=None
COLUMN user_sessions.created_at_ms bigint null=NO default=None
COLUMN user_sessions.last_seen_at_ms bigint null=NO default=None
COLUMN user_sessions.idle_timeout_ms bigint null=NO default=None
COLUMN user_sessions.expires_at_ms bigint null=NO default=None
COLUMN user_sessions.revoked_at_ms bigint null=YES default=None
COLUMN user_sessions.client text null=NO default=None
COLUMN user_sessions.user_agent text null=NO default=None
COLUMN worker_label_approvals.worker_id text null=NO default=None
COLUMN worker_label_approvals.labels_json text null=NO default=None
COLUMN worker_label_approvals.approved_by text null=YES default=None
COLUMN worker_label_approvals.approved_at_ms bigint null=NO default=None
COLUMN worker_label_approvals.requested_labels_json text null=YES default=None
COLUMN worker_label_approvals.requested_at_ms bigint null=YES default=None
COLUMN workers.worker_id text null=NO default=None
COLUMN workers.session_id text null=NO default=None
COLUMN workers.generation integer null=NO default=None
COLUMN workers.status text null=NO default=None
COLUMN workers.version integer null=NO default=None
COLUMN workers.capabilities_json text null=NO default=None
COLUMN workers.capabilities_hash text null=NO default=None
COLUMN workers.max_concurrent_runs integer null=NO default=None
COLUMN workers.active_leases integer null=NO default=0
COLUMN workers.session_lease_ms bigint null=NO default=None
COLUMN workers.registered_at_ms bigint null=NO default=None
COLUMN workers.last_heartbeat_at_ms bigint null=NO default=None
COLUMN workers.lease_expires_at_ms bigint null=NO default=None
COLUMN workers.updated_at_ms bigint null=NO default=None
INDEX CREATE UNIQUE INDEX approval_policies_pkey ON public.approval_policies USING btree (project_id)
INDEX CREATE UNIQUE INDEX approval_requests_consumption_id_key ON public.approval_requests USING btree (consumption_id)
INDEX CREATE UNIQUE INDEX approval_requests_dispatch_id_key ON public.approval_requests USING btree (dispatch_id)
INDEX CREATE UNIQUE INDEX approval_requests_pkey ON public.approval_requests USING btree (id)
INDEX CREATE INDEX approval_requests_project ON public.approval_requests USING btree (project_id, requested_at_ms, id)
INDEX CREATE UNIQUE INDEX approval_requests_project_id_id_key ON public.approval_requests USING btree (project_id, id)
INDEX CREATE INDEX approval_requests_project_state ON public.approval_requests USING btree (project_id, state, requested_at_ms, id)
INDEX CREATE INDEX approval_requests_unconsumed ON public.approval_requests USING btree (decided_at_ms, id) WHERE (state = 'approved'::text)
INDEX CREATE UNIQUE INDEX approved_action_dispatches_approval_request_id_key ON public.approved_action_dispatches USING btree (approval_request_id)
INDEX CREATE UNIQUE INDEX approved_action_dispatches_pkey ON public.approved_action_dispatches USING btree (id)
INDEX CREATE UNIQUE INDEX approved_action_dispatches_project_id_id_key ON public.approved_action_dispatches USING btree (project_id, id)
INDEX CREATE INDEX approved_action_executions_due ON public.approved_action_executions USING btree (eligible_at_ms, dispatch_id) WHERE (eligible_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX approved_action_executions_pkey ON public.approved_action_executions USING btree (dispatch_id)
INDEX CREATE INDEX approved_action_executions_project ON public.approved_action_executions USING btree (project_id, created_at_ms, dispatch_id)
INDEX CREATE UNIQUE INDEX approved_action_executions_project_id_dispatch_id_key ON public.approved_action_executions USING btree (project_id, dispatch_id)
INDEX CREATE INDEX approved_action_recovery_due ON public.approved_action_recovery USING btree (next_scan_at_ms, dispatch_id) WHERE (status = 'armed'::text)
INDEX CREATE UNIQUE INDEX approved_action_recovery_pkey ON public.approved_action_recovery USING btree (dispatch_id)
INDEX CREATE UNIQUE INDEX approved_action_resolutions_mutation_id_key ON public.approved_action_resolutions USING btree (mutation_id)
INDEX CREATE UNIQUE INDEX approved_action_resolutions_pkey ON public.approved_action_resolutions USING btree (dispatch_id)
INDEX CREATE UNIQUE INDEX approved_run_action_receipts_pkey ON public.approved_run_action_receipts USING btree (dispatch_id)
INDEX CREATE INDEX approved_run_action_receipts_project_run ON public.approved_run_action_receipts USING btree (project_id, resource_id)
INDEX CREATE UNIQUE INDEX approved_run_action_receipts_resource_type_resource_id_key ON public.approved_run_action_receipts USING btree (resource_type, resource_id)
INDEX CREATE UNIQUE INDEX attempt_log_chunks_pkey ON public.attempt_log_chunks USING btree (attempt_id, start_offset)
INDEX CREATE UNIQUE INDEX attempt_logs_pkey ON public.attempt_logs USING btree (attempt_id)
INDEX CREATE UNIQUE INDEX cancellation_audit_pkey ON public.cancellation_audit USING btree (id)
INDEX CREATE UNIQUE INDEX cancellation_audit_project_id_operation_mutation_id_key ON public.cancellation_audit USING btree (project_id, operation, mutation_id)
INDEX CREATE INDEX cancellation_audit_project_run ON public.cancellation_audit USING btree (project_id, run_id)
INDEX CREATE INDEX cancellation_audit_run ON public.cancellation_audit USING btree (run_id, created_at_ms)
INDEX CREATE INDEX cancellation_dispatches_attempt ON public.cancellation_dispatches USING btree (attempt_id)
INDEX CREATE INDEX cancellation_dispatches_blocked ON public.cancellation_dispatches USING btree (project_id, updated_at_ms, run_id) WHERE (status = 'blocked'::text)
INDEX CREATE INDEX cancellation_dispatches_due ON public.cancellation_dispatches USING btree (status, next_attempt_at_ms, run_id)
INDEX CREATE UNIQUE INDEX cancellation_dispatches_pkey ON public.cancellation_dispatches USING btree (run_id)
INDEX CREATE INDEX cancellation_dispatches_project ON public.cancellation_dispatches USING btree (project_id, status)
INDEX CREATE UNIQUE INDEX cron_skips_pkey ON public.cron_skips USING btree (task_id, occurrence_ms)
INDEX CREATE INDEX cron_skips_project ON public.cron_skips USING btree (project_id, created_at_ms)
INDEX CREATE UNIQUE INDEX cron_start_epoch_pkey ON public.cron_start_epoch USING btree (singleton)
INDEX CREATE UNIQUE INDEX notification_channels_pkey ON public.notification_channels USING btree (id)
INDEX CREATE UNIQUE INDEX notification_channels_project_id_name_key ON public.notification_channels USING btree (project_id, name)
INDEX CREATE UNIQUE INDEX notification_outbox_channel_id_outcome_key_key ON public.notification_outbox USING btree (channel_id, outcome_key)
INDEX CREATE INDEX notification_outbox_due ON public.notification_outbox USING btree (due_at_ms, id) WHERE (due_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX notification_outbox_pkey ON public.notification_outbox USING btree (id)
INDEX CREATE INDEX notification_outbox_project_created ON public.notification_outbox USING btree (project_id, created_at_ms, id)
INDEX CREATE INDEX notification_outbox_settled ON public.notification_outbox USING btree (updated_at_ms, id) WHERE (due_at_ms IS NULL)
INDEX CREATE UNIQUE INDEX notification_rules_pkey ON public.notification_rules USING btree (id)
INDEX CREATE INDEX notification_rules_project ON public.notification_rules USING btree (project_id, channel_id)
INDEX CREATE INDEX parked_items_loop ON public.parked_items USING btree (loop, last_failed_at_ms, item_kind, item_key)
INDEX CREATE UNIQUE INDEX parked_items_pkey ON public.parked_items USING btree (item_kind, item_key)
INDEX CREATE INDEX parked_items_project ON public.parked_items USING btree (project_id, last_failed_at_ms) WHERE (project_id IS NOT NULL)
INDEX CREATE UNIQUE INDEX principals_pkey ON public.principals USING btree (id)
INDEX CREATE UNIQUE INDEX principals_token_digest_key ON public.principals USING btree (token_digest)
INDEX CREATE UNIQUE INDEX project_dependencies_pkey ON public.project_dependencies USING btree (project_id, kind, name)
INDEX CREATE UNIQUE INDEX project_settings_pkey ON public.project_settings USING btree (project_id)
INDEX CREATE UNIQUE INDEX project_variables_pkey ON public.project_variables USING btree (project_id, name)
INDEX CREATE UNIQUE INDEX projects_name_key ON public.projects USING btree (name)
INDEX CREATE UNIQUE INDEX projects_pkey ON public.projects USING btree (id)
INDEX CREATE UNIQUE INDEX ql3_clock_pkey ON public.ql3_clock USING btree (singleton)
INDEX CREATE UNIQUE INDEX retention_policies_pkey ON public.retention_policies USING btree (project_id)
INDEX CREATE UNIQUE INDEX role_bindings_pkey ON public.role_bindings USING btree (principal_id, project_id)
INDEX CREATE INDEX run_attempts_deadline ON public.run_attempts USING btree (status, deadline_at_ms, id)
INDEX CREATE INDEX run_attempts_finished ON public.run_attempts USING btree (finished_at_ms, id) WHERE (finished_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX run_attempts_pkey ON public.run_attempts USING btree (id)
INDEX CREATE UNIQUE INDEX run_attempts_run_id_attempt_key ON public.run_attempts USING btree (run_id, attempt)
INDEX CREATE UNIQUE INDEX run_events_pkey ON public.run_events USING btree (id)
INDEX CREATE UNIQUE INDEX run_events_run_id_dedupe_key_key ON public.run_events USING btree (run_id, dedupe_key)
INDEX CREATE UNIQUE INDEX run_events_run_id_sequence_key ON public.run_events USING btree (run_id, sequence)
INDEX CREATE INDEX run_leases_expiry ON public.run_leases USING btree (status, expires_at_ms, attempt_id)
INDEX CREATE UNIQUE INDEX run_leases_pkey ON public.run_leases USING btree (attempt_id)
INDEX CREATE INDEX run_leases_run ON public.run_leases USING btree (run_id)
INDEX CREATE INDEX run_leases_worker ON public.run_leases USING btree (worker_id, status)
INDEX CREATE INDEX run_retry_due ON public.run_retry_policies USING btree (next_retry_at_ms) WHERE (next_retry_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX run_retry_policies_pkey ON public.run_retry_policies USING btree (run_id)
INDEX CREATE INDEX runs_dispatch_candidates ON public.runs USING btree (priority DESC, queued_at_ms, id) WHERE ((status = 'queued'::text) AND (cancel_requested_at_ms IS NULL))
INDEX CREATE INDEX runs_finished ON public.runs USING btree (finished_at_ms, id) WHERE (finished_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX runs_idempotency ON public.runs USING btree (project_id, idempotency_key) WHERE (idempotency_key IS NOT NULL)
INDEX CREATE INDEX runs_live_cancel_intent ON public.runs USING btree (cancel_requested_at_ms, id) WHERE ((cancel_requested_at_ms IS NOT NULL) AND (status = ANY (ARRAY['created'::text, 'queued'::text, 'dispatching'::text, 'running'::text, 'waiting_approval'::text, 'retry_wait'::text, 'lost'::text])))
INDEX CREATE UNIQUE INDEX runs_pkey ON public.runs USING btree (id)
INDEX CREATE INDEX runs_project_created ON public.runs USING btree (project_id, created_at_ms, id)
INDEX CREATE UNIQUE INDEX runs_project_id_id_key ON public.runs USING btree (project_id, id)
INDEX CREATE INDEX runs_project_live ON public.runs USING btree (project_id, created_at_ms, id) WHERE (status = ANY (ARRAY['created'::text, 'queued'::text, 'dispatching'::text, 'running'::text, 'waiting_approval'::text, 'retry_wait'::text, 'lost'::text]))
INDEX CREATE INDEX runs_status ON public.runs USING btree (status, created_at_ms)
INDEX CREATE INDEX runs_task_created ON public.runs USING btree (task_id, created_at_ms, id)
INDEX CREATE INDEX runs_task_outcome ON public.runs USING btree (task_id, status, finished_at_ms)
INDEX CREATE UNIQUE INDEX script_revisions_pkey ON public.script_revisions USING btree (project_id, path, revision)
INDEX CREATE UNIQUE INDEX scripts_pkey ON public.scripts USING btree (project_id, path)
INDEX CREATE UNIQUE INDEX server_keys_pkey ON public.server_keys USING btree (name)
INDEX CREATE UNIQUE INDEX subscription_files_pkey ON public.subscription_files USING btree (subscription_id, path)
INDEX CREATE INDEX subscription_syncs_by_subscription ON public.subscription_syncs USING btree (subscription_id, started_at_ms)
INDEX CREATE UNIQUE INDEX subscription_syncs_pkey ON public.subscription_syncs USING btree (id)
INDEX CREATE INDEX subscriptions_due ON public.subscriptions USING btree (next_sync_at_ms) WHERE (next_sync_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX subscriptions_pkey ON public.subscriptions USING btree (id)
INDEX CREATE UNIQUE INDEX subscriptions_project_id_name_key ON public.subscriptions USING btree (project_id, name)
INDEX CREATE UNIQUE INDEX task_revisions_pkey ON public.task_revisions USING btree (task_id, revision)
INDEX CREATE INDEX task_schedules_due ON public.task_schedules USING btree (next_fire_at_ms, task_id) WHERE (next_fire_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX task_schedules_pkey ON public.task_schedules USING btree (task_id)
INDEX CREATE INDEX task_schedules_project_due ON public.task_schedules USING btree (project_id, next_fire_at_ms, task_id) WHERE (next_fire_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX tasks_live_name ON public.tasks USING btree (project_id, name) WHERE (deleted_at_ms IS NULL)
INDEX CREATE UNIQUE INDEX tasks_pkey ON public.tasks USING btree (id)
INDEX CREATE INDEX tasks_project ON public.tasks USING btree (project_id, created_at_ms, id)
INDEX CREATE UNIQUE INDEX user_logins_login_key ON public.user_logins USING btree (login)
INDEX CREATE UNIQUE INDEX user_logins_pkey ON public.user_logins USING btree (principal_id)
INDEX CREATE INDEX user_sessions_by_expiry ON public.user_sessions USING btree (expires_at_ms)
INDEX CREATE INDEX user_sessions_by_principal ON public.user_sessions USING btree (principal_id, created_at_ms)
INDEX CREATE UNIQUE INDEX user_sessions_pkey ON public.user_sessions USING btree (id)
INDEX CREATE UNIQUE INDEX user_sessions_secret_digest_key ON public.user_sessions USING btree (secret_digest)
INDEX CREATE UNIQUE INDEX worker_label_approvals_pkey ON public.worker_label_approvals USING btree (worker_id)
INDEX CREATE UNIQUE INDEX workers_pkey ON public.workers USING btree (worker_id)
INDEX CREATE INDEX workers_status ON public.workers USING btree (status, worker_id)
CONSTRAINT approval_policies.approval_policies_pkey PRIMARY KEY (project_id)
CONSTRAINT approval_policies.approval_policies_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT approval_policies.approval_policies_second_admin_check CHECK ((second_admin = ANY (ARRAY[0, 1])))
CONSTRAINT approval_policies.approval_policies_updated_by_fkey FOREIGN KEY (updated_by) REFERENCES principals(id)
CONSTRAINT approval_policies.approval_policies_version_check CHECK ((version >= 1))
CONSTRAINT approval_requests.approval_requests_action_digest_check CHECK ((action_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approval_requests.approval_requests_action_plan_json_check CHECK (((length(action_plan_json) >= 2) AND (length(action_plan_json) <= 4096)))
CONSTRAINT approval_requests.approval_requests_action_ref_check CHECK (((length(action_ref) >= 1) AND (length(action_ref) <= 255)))
CONSTRAINT approval_requests.approval_requests_action_type_check CHECK ((action_type ~ '^[a-z][a-z0-9_.]{0,63}$'::text))
CONSTRAINT approval_requests.approval_requests_check CHECK (((expires_at_ms > requested_at_ms) AND ((expires_at_ms - requested_at_ms) <= 86400000)))
CONSTRAINT approval_requests.approval_requests_check1 CHECK ((((decision_id IS NULL) AND (decision IS NULL) AND (reason_code IS NULL) AND (decided_by IS NULL) AND (decided_at_ms IS NULL) AND (decision_fence IS NULL)) OR ((decision_id IS NOT NULL) AND (decision IS NOT NULL) AND (reason_code IS NOT NULL) AND (decided_by IS NOT NULL) AND (decided_at_ms IS NOT NULL) AND (decision_fence IS NOT NULL))))
CONSTRAINT approval_requests.approval_requests_check2 CHECK ((((consumption_id IS NULL) AND (dispatch_id IS NULL) AND (consumed_by IS NULL) AND (consumed_at_ms IS NULL) AND (consumption_fence IS NULL)) OR ((consumption_id IS NOT NULL) AND (dispatch_id IS NOT NULL) AND (consumed_by IS NOT NULL) AND (consumed_at_ms IS NOT NULL) AND (consumption_fence IS NOT NULL))))
CONSTRAINT approval_requests.approval_requests_check3 CHECK (((decided_at_ms IS NULL) OR ((decided_at_ms >= requested_at_ms) AND (decided_at_ms < expires_at_ms))))
CONSTRAINT approval_requests.approval_requests_check4 CHECK (((decided_by IS NULL) OR (decided_by <> requested_by)))
CONSTRAINT approval_requests.approval_requests_check5 CHECK (((consumed_at_ms IS NULL) OR ((decided_at_ms IS NOT NULL) AND (consumed_at_ms >= decided_at_ms) AND (consumed_at_ms < expires_at_ms))))
CONSTRAINT approval_requests.approval_requests_check6 CHECK ((((state = 'pending'::text) AND (version = 1) AND (decision_id IS NULL) AND (consumption_id IS NULL)) OR ((state = 'approved'::text) AND (version = 2) AND (decision IS NOT NULL) AND (decision = 'approve'::text) AND (consumption_id IS NULL)) OR ((state = 'rejected'::text) AND (version = 2) AND (decision IS NOT NULL) AND (decision = 'reject'::text) AND (consumption_id IS NULL)) OR ((state = 'consumed'::text) AND (version = 3) AND (decision IS NOT NULL) AND (decision = 'approve'::text) AND (consumption_id IS NOT NULL))))
CONSTRAINT approval_requests.approval_requests_consumed_by_check CHECK (((consumed_by IS NULL) OR (consumed_by = ANY (ARRAY['system'::text, 'worker'::text]))))
CONSTRAINT approval_requests.approval_requests_consumption_id_check CHECK (((consumption_id IS NULL) OR ((length(consumption_id) >= 1) AND (length(consumption_id) <= 128))))
CONSTRAINT approval_requests.approval_requests_consumption_id_key UNIQUE (consumption_id)
CONSTRAINT approval_requests.approval_requests_decided_by_fkey FOREIGN KEY (decided_by) REFERENCES principals(id)
CONSTRAINT approval_requests.approval_requests_decision_check CHECK (((decision IS NULL) OR (decision = ANY (ARRAY['approve'::text, 'reject'::text]))))
CONSTRAINT approval_requests.approval_requests_decision_id_check CHECK (((decision_id IS NULL) OR ((length(decision_id) >= 1) AND (length(decision_id) <= 128))))
CONSTRAINT approval_requests.approval_requests_decision_note CHECK (((decision_note IS NULL) OR (((char_length(decision_note) >= 1) AND (char_length(decision_note) <= 500)) AND (decision IS NOT NULL))))
CONSTRAINT approval_requests.approval_requests_dispatch_id_key UNIQUE (dispatch_id)
CONSTRAINT approval_requests.approval_requests_id_check CHECK (((length(id) >= 1) AND (length(id) <= 128)))
CONSTRAINT approval_requests.approval_requests_permission_check CHECK ((permission = 'run.create'::text))
CONSTRAINT approval_requests.approval_requests_pkey PRIMARY KEY (id)
CONSTRAINT approval_requests.approval_requests_preview_digest_check CHECK ((preview_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approval_requests.approval_requests_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT approval_requests.approval_requests_project_id_id_key UNIQUE (project_id, id)
CONSTRAINT approval_requests.approval_requests_reason_code_check CHECK (((reason_code IS NULL) OR (reason_code ~ '^[a-z][a-z0-9_]{0,63}$'::text)))
CONSTRAINT approval_requests.approval_requests_request_digest_check CHECK ((request_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approval_requests.approval_requests_requested_by_fkey FOREIGN KEY (requested_by) REFERENCES principals(id)
CONSTRAINT approval_requests.approval_requests_risk_check CHECK ((risk = ANY (ARRAY['low'::text, 'medium'::text, 'high'::text, 'critical'::text])))
CONSTRAINT approval_requests.approval_requests_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'approved'::text, 'rejected'::text, 'consumed'::text])))
CONSTRAINT approval_requests.approval_requests_version_check CHECK (((version >= 1) AND (version <= 3)))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_action_digest_check CHECK ((action_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_action_plan_json_check CHECK (((length(action_plan_json) >= 2) AND (length(action_plan_json) <= 4096)))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_action_ref_check CHECK (((length(action_ref) >= 1) AND (length(action_ref) <= 255)))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_action_type_check CHECK ((action_type ~ '^[a-z][a-z0-9_.]{0,63}$'::text))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_approval_request_id_key UNIQUE (approval_request_id)
CONSTRAINT approved_action_dispatches.approved_action_dispatches_approval_request_version_check CHECK ((approval_request_version = 3))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_check CHECK ((approved_by <> requested_by))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_check1 CHECK (((approved_at_ms <= created_at_ms) AND (created_at_ms < expires_at_ms)))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_consumed_by_check CHECK ((consumed_by = ANY (ARRAY['system'::text, 'worker'::text])))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_dispatch_digest_check CHECK ((dispatch_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approved_action_dispatches.approved_action_dispatches_pkey PRIMARY KEY (id)
CONSTRAINT approved_action_dispatches.approved_action_dispatches_project_id_approval_request_id_fkey FOREIGN KEY (project_id, approval_request_id) REFERENCES approval_requests(project_id, id)
CONSTRAINT approved_action_dispatches.approved_action_dispatches_project_id_id_key UNIQUE (project_id, id)
CONSTRAINT approved_action_executions.approved_action_executions_attempt_count_check CHECK ((attempt_count >= 0))
CONSTRAINT approved_action_executions.approved_action_executions_check CHECK (((attempt_count <= max_attempts) AND (version >= attempt_count) AND (updated_at_ms >= created_at_ms)))
CONSTRAINT approved_action_executions.approved_action_executions_check1 CHECK (((lease_expires_at_ms IS NULL) OR ((lease_expires_at_ms > updated_at_ms) AND (lease_expires_at_ms <= (updated_at_ms + 600000)))))
CONSTRAINT approved_action_executions.approved_action_executions_check2 CHECK (((started_at_ms IS NULL) OR (started_at_ms >= created_at_ms)))
CONSTRAINT approved_action_executions.approved_action_executions_check3 CHECK ((((status = 'pending'::text) AND (version = 0) AND (attempt_count = 0) AND (eligible_at_ms IS NOT NULL) AND (eligible_at_ms >= created_at_ms) AND (next_attempt_at_ms IS NULL) AND (lease_owner IS NULL) AND (lease_token_digest IS NULL) AND (lease_expires_at_ms IS NULL) AND (started_at_ms IS NULL) AND (result_mutation_id IS NULL) AND (result_code IS NULL) AND (result_digest IS NULL) AND (completed_at_ms IS NULL)) OR ((status = 'leased'::text) AND (lease_owner IS NOT NULL) AND (lease_token_digest IS NOT NULL) AND (lease_expires_at_ms IS NOT NULL) AND (attempt_count >= 1) AND (eligible_at_ms IS NOT NULL) AND (eligible_at_ms = lease_expires_at_ms) AND (next_attempt_at_ms IS NULL) AND (started_at_ms IS NULL) AND (result_digest IS NULL) AND (completed_at_ms IS NULL)) OR ((status = 'executing'::text) AND (lease_owner IS NOT NULL) AND (lease_token_digest IS NOT NULL) AND (lease_expires_at_ms IS NOT NULL) AND (attempt_count >= 1) AND (eligible_at_ms IS NULL) AND (next_attempt_at_ms IS NULL) AND (started_at_ms IS NOT NULL) AND (started_at_ms < lease_expires_at_ms) AND (result_mutation_id IS NULL) AND (result_code IS NULL) AND (result_digest IS NULL) AND (completed_at_ms IS NULL)) OR ((status = 'retry_wait'::text) AND (lease_owner IS NULL) AND (lease_token_digest IS NULL) AND (lease_expires_at_ms IS NULL) AND (attempt_count >= 1) AND (attempt_count < max_attempts) AND (next_attempt_at_ms IS NOT NULL) AND (eligible_at_ms IS NOT NULL) AND (eligible_at_ms = next_attempt_at_ms) AND (result_code IS NOT NULL) AND (started_at_ms IS NULL) AND (result_digest IS NULL) AND (completed_at_ms IS NULL)) OR ((status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'blocked'::text])) AND (lease_owner IS NULL) AND (lease_token_digest IS NULL) AND (lease_expires_at_ms IS NULL) AND (eligible_at_ms IS NULL) AND (next_attempt_at_ms IS NULL) AND (result_code IS NOT NULL) AND (result_mutation_id IS NOT NULL) AND (completed_at_ms IS NOT NULL) AND (completed_at_ms = updated_at_ms))))
CONSTRAINT approved_action_executions.approved_action_executions_check4 CHECK (((status <> 'succeeded'::text) OR ((started_at_ms IS NOT NULL) AND (result_digest IS NOT NULL))))
CONSTRAINT approved_action_executions.approved_action_executions_check5 CHECK (((status <> 'failed'::text) OR ((started_at_ms IS NOT NULL) AND (result_digest IS NULL))))
CONSTRAINT approved_action_executions.approved_action_executions_check6 CHECK (((status <> 'blocked'::text) OR (result_digest IS NULL)))
CONSTRAINT approved_action_executions.approved_action_executions_dispatch_digest_check CHECK ((dispatch_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approved_action_executions.approved_action_executions_execution_digest_check CHECK ((execution_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approved_action_executions.approved_action_executions_lease_owner_check CHECK (((lease_owner IS NULL) OR ((length(lease_owner) >= 1) AND (length(lease_owner) <= 128))))
CONSTRAINT approved_action_executions.approved_action_executions_lease_token_digest_check CHECK (((lease_token_digest IS NULL) OR (lease_token_digest ~ '^[0-9a-f]{64}$'::text)))
CONSTRAINT approved_action_executions.approved_action_executions_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 16)))
CONSTRAINT approved_action_executions.approved_action_executions_pkey PRIMARY KEY (dispatch_id)
CONSTRAINT approved_action_executions.approved_action_executions_project_id_dispatch_id_fkey FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_dispatches(project_id, id)
CONSTRAINT approved_action_executions.approved_action_executions_project_id_dispatch_id_key UNIQUE (project_id, dispatch_id)
CONSTRAINT approved_action_executions.approved_action_executions_result_code_check CHECK (((result_code IS NULL) OR (result_code ~ '^[a-z][a-z0-9_]{0,63}$'::text)))
CONSTRAINT approved_action_executions.approved_action_executions_result_digest_check CHECK (((result_digest IS NULL) OR (result_digest ~ '^[0-9a-f]{64}$'::text)))
CONSTRAINT approved_action_executions.approved_action_executions_result_mutation_id_check CHECK (((result_mutation_id IS NULL) OR ((length(result_mutation_id) >= 1) AND (length(result_mutation_id) <= 128))))
CONSTRAINT approved_action_executions.approved_action_executions_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'leased'::text, 'executing'::text, 'retry_wait'::text, 'succeeded'::text, 'failed'::text, 'blocked'::text])))
CONSTRAINT approved_action_executions.approved_action_executions_version_check CHECK ((version >= 0))
CONSTRAINT approved_action_recovery.approved_action_recovery_check CHECK ((((resolver_owner IS NULL) AND (resolver_token_digest IS NULL) AND (resolver_lease_expires_at_ms IS NULL)) OR ((resolver_owner IS NOT NULL) AND (resolver_token_digest IS NOT NULL) AND (resolver_lease_expires_at_ms IS NOT NULL))))
CONSTRAINT approved_action_recovery.approved_action_recovery_check1 CHECK ((((status = 'armed'::text) AND (next_scan_at_ms IS NOT NULL) AND (resolution_mutation_id IS NULL)) OR ((status = 'manual'::text) AND (next_scan_at_ms IS NULL) AND (resolver_owner IS NULL) AND (resolution_mutation_id IS NULL)) OR ((status = 'resolved'::text) AND (next_scan_at_ms IS NULL) AND (resolver_owner IS NULL) AND (resolution_mutation_id IS NOT NULL))))
CONSTRAINT approved_action_recovery.approved_action_recovery_evidence_digest_check CHECK (((evidence_digest IS NULL) OR (evidence_digest ~ '^[0-9a-f]{64}$'::text)))
CONSTRAINT approved_action_recovery.approved_action_recovery_execution_version_check CHECK ((execution_version >= 1))
CONSTRAINT approved_action_recovery.approved_action_recovery_last_finding_check CHECK (((last_finding IS NULL) OR (last_finding = ANY (ARRAY['verified_succeeded'::text, 'verified_failed'::text, 'still_running'::text, 'missing'::text, 'conflict'::text, 'unsupported'::text, 'unavailable'::text, 'manual_only'::text, 'completed'::text]))))
CONSTRAINT approved_action_recovery.approved_action_recovery_pkey PRIMARY KEY (dispatch_id)
CONSTRAINT approved_action_recovery.approved_action_recovery_project_id_dispatch_id_fkey FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_executions(project_id, dispatch_id)
CONSTRAINT approved_action_recovery.approved_action_recovery_resolution_mutation_id_check CHECK (((resolution_mutation_id IS NULL) OR ((length(resolution_mutation_id) >= 1) AND (length(resolution_mutation_id) <= 128))))
CONSTRAINT approved_action_recovery.approved_action_recovery_resolver_owner_check CHECK (((resolver_owner IS NULL) OR ((length(resolver_owner) >= 1) AND (length(resolver_owner) <= 128))))
CONSTRAINT approved_action_recovery.approved_action_recovery_resolver_token_digest_check CHECK (((resolver_token_digest IS NULL) OR (resolver_token_digest ~ '^[0-9a-f]{64}$'::text)))
CONSTRAINT approved_action_recovery.approved_action_recovery_scan_count_check CHECK ((scan_count >= 0))
CONSTRAINT approved_action_recovery.approved_action_recovery_status_check CHECK ((status = ANY (ARRAY['armed'::text, 'manual'::text, 'resolved'::text])))
CONSTRAINT approved_action_recovery.approved_action_recovery_version_check CHECK ((version >= 0))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_actor_id_check CHECK (((length(actor_id) >= 1) AND (length(actor_id) <= 128)))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_actor_role_check CHECK (((actor_role IS NULL) OR (actor_role = ANY (ARRAY['approver'::text, 'admin'::text]))))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_actor_type_check CHECK ((actor_type = ANY (ARRAY['system'::text, 'user'::text])))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_check CHECK ((((source = 'resolver'::text) AND (actor_type = 'system'::text) AND (actor_role IS NULL) AND (evidence_digest IS NOT NULL) AND (resolution = ANY (ARRAY['verified_succeeded'::text, 'verified_failed'::text]))) OR ((source = 'manual'::text) AND (actor_type = 'user'::text) AND (actor_role IS NOT NULL) AND (resolution = ANY (ARRAY['confirm_succeeded'::text, 'confirm_failed'::text, 'abandon_unknown'::text])))))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_check1 CHECK ((((resolution = ANY (ARRAY['verified_succeeded'::text, 'confirm_succeeded'::text])) AND (outcome = 'succeeded'::text)) OR ((resolution = ANY (ARRAY['verified_failed'::text, 'confirm_failed'::text])) AND (outcome = 'failed'::text)) OR ((resolution = 'abandon_unknown'::text) AND (outcome = 'blocked'::text))))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_evidence_digest_check CHECK (((evidence_digest IS NULL) OR (evidence_digest ~ '^[0-9a-f]{64}$'::text)))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_expected_execution_version_check CHECK ((expected_execution_version >= 1))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_mutation_id_check CHECK (((length(mutation_id) >= 1) AND (length(mutation_id) <= 128)))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_mutation_id_key UNIQUE (mutation_id)
CONSTRAINT approved_action_resolutions.approved_action_resolutions_outcome_check CHECK ((outcome = ANY (ARRAY['succeeded'::text, 'failed'::text, 'blocked'::text])))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_pkey PRIMARY KEY (dispatch_id)
CONSTRAINT approved_action_resolutions.approved_action_resolutions_project_id_dispatch_id_fkey FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_executions(project_id, dispatch_id)
CONSTRAINT approved_action_resolutions.approved_action_resolutions_reason_code_check CHECK ((reason_code ~ '^[a-z][a-z0-9_]{0,63}$'::text))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_resolution_check CHECK ((resolution = ANY (ARRAY['verified_succeeded'::text, 'verified_failed'::text, 'confirm_succeeded'::text, 'confirm_failed'::text, 'abandon_unknown'::text])))
CONSTRAINT approved_action_resolutions.approved_action_resolutions_source_check CHECK ((source = ANY (ARRAY['resolver'::text, 'manual'::text])))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_action_digest_check CHECK ((action_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_action_type_check CHECK ((action_type = 'run.create'::text))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_check CHECK ((idempotency_key = dispatch_id))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_check1 CHECK (((finished_at_ms >= started_at_ms) AND (created_at_ms = finished_at_ms)))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_evidence_digest_check CHECK ((evidence_digest ~ '^[0-9a-f]{64}$'::text))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_execution_attempt_check CHECK (((execution_attempt >= 1) AND (execution_attempt <= 16)))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_execution_version_check CHECK ((execution_version >= 1))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_outcome_check CHECK ((outcome = 'succeeded'::text))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_pkey PRIMARY KEY (dispatch_id)
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_project_id_approval_request_i_fkey FOREIGN KEY (project_id, approval_request_id) REFERENCES approval_requests(project_id, id)
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_project_id_dispatch_id_fkey FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_dispatches(project_id, id)
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_project_id_resource_id_fkey FOREIGN KEY (project_id, resource_id) REFERENCES runs(project_id, id)
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_resource_type_check CHECK ((resource_type = 'run'::text))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_resource_type_resource_id_key UNIQUE (resource_type, resource_id)
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_result_code_check CHECK ((result_code = 'approved_run_created'::text))
CONSTRAINT approved_run_action_receipts.approved_run_action_receipts_schema_version_check CHECK ((schema_version = 1))
CONSTRAINT attempt_log_chunks.attempt_log_chunks_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES attempt_logs(attempt_id)
CONSTRAINT attempt_log_chunks.attempt_log_chunks_data_check CHECK (((octet_length(data) >= 1) AND (octet_length(data) <= 65536)))
CONSTRAINT attempt_log_chunks.attempt_log_chunks_pkey PRIMARY KEY (attempt_id, start_offset)
CONSTRAINT attempt_log_chunks.attempt_log_chunks_start_offset_check CHECK ((start_offset >= 0))
CONSTRAINT attempt_logs.attempt_logs_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES run_attempts(id)
CONSTRAINT attempt_logs.attempt_logs_cap_bytes_check CHECK ((cap_bytes >= 1))
CONSTRAINT attempt_logs.attempt_logs_check CHECK ((stored_bytes <= cap_bytes))
CONSTRAINT attempt_logs.attempt_logs_check1 CHECK (((truncated_at_ms IS NULL) OR (stored_bytes = cap_bytes)))
CONSTRAINT attempt_logs.attempt_logs_pkey PRIMARY KEY (attempt_id)
CONSTRAINT attempt_logs.attempt_logs_stored_bytes_check CHECK ((stored_bytes >= 0))
CONSTRAINT cancellation_audit.cancellation_audit_operation_check CHECK ((operation = 'cancellation.rearm'::text))
CONSTRAINT cancellation_audit.cancellation_audit_pkey PRIMARY KEY (id)
CONSTRAINT cancellation_audit.cancellation_audit_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT cancellation_audit.cancellation_audit_project_id_operation_mutation_id_key UNIQUE (project_id, operation, mutation_id)
CONSTRAINT cancellation_audit.cancellation_audit_project_id_run_id_fkey FOREIGN KEY (project_id, run_id) REFERENCES runs(project_id, id)
CONSTRAINT cancellation_dispatches.cancellation_dispatches_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES run_attempts(id)
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check CHECK ((version >= dispatch_count))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check1 CHECK ((((status = 'leased'::text) AND (lease_owner IS NOT NULL) AND (lease_token_digest IS NOT NULL) AND (lease_expires_at_ms IS NOT NULL)) OR ((status <> 'leased'::text) AND (lease_owner IS NULL) AND (lease_token_digest IS NULL) AND (lease_expires_at_ms IS NULL))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check2 CHECK ((((status = ANY (ARRAY['pending'::text, 'retry_wait'::text])) AND (next_attempt_at_ms IS NOT NULL)) OR ((status <> ALL (ARRAY['pending'::text, 'retry_wait'::text])) AND (next_attempt_at_ms IS NULL))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check3 CHECK ((((status = 'pending'::text) AND (version = 0) AND (dispatch_count = 0) AND (last_result IS NULL)) OR ((status <> 'pending'::text) AND (dispatch_count >= 1))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check4 CHECK (((status <> 'dispatched'::text) OR (last_result = ANY (ARRAY['termination_requested'::text, 'already_exited'::text]))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check5 CHECK (((status <> 'blocked'::text) OR (last_result = ANY (ARRAY['identity_mismatch'::text, 'pid_mismatch'::text, 'unsupported'::text, 'invalid'::text]))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check6 CHECK (((status <> 'retry_wait'::text) OR (last_result = ANY (ARRAY['controller_missing'::text, 'handle_missing'::text, 'dispatch_error'::text, 'identity_mismatch'::text, 'pid_mismatch'::text, 'unsupported'::text, 'invalid'::text]))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_check7 CHECK (((status <> 'leased'::text) OR (last_result IS NULL) OR (last_result <> ALL (ARRAY['termination_requested'::text, 'already_exited'::text]))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_dispatch_count_check CHECK ((dispatch_count >= 0))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_last_result_check CHECK (((last_result IS NULL) OR (last_result = ANY (ARRAY['controller_missing'::text, 'handle_missing'::text, 'dispatch_error'::text, 'identity_mismatch'::text, 'pid_mismatch'::text, 'unsupported'::text, 'invalid'::text, 'termination_requested'::text, 'already_exited'::text]))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_lease_owner_check CHECK (((lease_owner IS NULL) OR ((length(lease_owner) >= 1) AND (length(lease_owner) <= 128))))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_lease_token_digest_check CHECK (((lease_token_digest IS NULL) OR (length(lease_token_digest) = 64)))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_pkey PRIMARY KEY (run_id)
CONSTRAINT cancellation_dispatches.cancellation_dispatches_project_id_run_id_fkey FOREIGN KEY (project_id, run_id) REFERENCES runs(project_id, id)
CONSTRAINT cancellation_dispatches.cancellation_dispatches_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'leased'::text, 'retry_wait'::text, 'dispatched'::text, 'blocked'::text])))
CONSTRAINT cancellation_dispatches.cancellation_dispatches_version_check CHECK ((version >= 0))
CONSTRAINT cron_skips.cron_skips_check CHECK ((last_occurrence_ms >= occurrence_ms))
CONSTRAINT cron_skips.cron_skips_occurrences_check CHECK ((occurrences >= 1))
CONSTRAINT cron_skips.cron_skips_pkey PRIMARY KEY (task_id, occurrence_ms)
CONSTRAINT cron_skips.cron_skips_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT cron_skips.cron_skips_reason_check CHECK ((reason = ANY (ARRAY['overlap'::text, 'misfire'::text, 'disabled'::text, 'deleted'::text])))
CONSTRAINT cron_skips.cron_skips_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT cron_skips.cron_skips_task_revision_check CHECK ((task_revision >= 1))
CONSTRAINT cron_start_epoch.cron_start_epoch_epoch_check CHECK ((epoch >= 1))
CONSTRAINT cron_start_epoch.cron_start_epoch_pkey PRIMARY KEY (singleton)
CONSTRAINT cron_start_epoch.cron_start_epoch_running_check CHECK ((running = ANY (ARRAY[0, 1])))
CONSTRAINT cron_start_epoch.cron_start_epoch_singleton_check CHECK ((singleton = 1))
CONSTRAINT notification_channels.notification_channels_check CHECK ((((kind = 'webhook'::text) AND (secret IS NOT NULL)) OR ((kind = 'apprise'::text) AND (secret IS NULL))))
CONSTRAINT notification_channels.notification_channels_kind_check CHECK ((kind = ANY (ARRAY['webhook'::text, 'apprise'::text])))
CONSTRAINT notification_channels.notification_channels_name_check CHECK (((length(name) >= 1) AND (length(name) <= 64)))
CONSTRAINT notification_channels.notification_channels_pkey PRIMARY KEY (id)
CONSTRAINT notification_channels.notification_channels_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT notification_channels.notification_channels_project_id_name_key UNIQUE (project_id, name)
CONSTRAINT notification_channels.notification_channels_scheme_check CHECK (((length(scheme) >= 1) AND (length(scheme) <= 32)))
CONSTRAINT notification_channels.notification_channels_secret_check CHECK (((secret IS NULL) OR ((length(secret) >= 16) AND (length(secret) <= 256))))
CONSTRAINT notification_channels.notification_channels_target_check CHECK (((length(target) >= 1) AND (length(target) <= 2048)))
CONSTRAINT notification_outbox.notification_outbox_attempts_check CHECK ((attempts >= 0))
CONSTRAINT notification_outbox.notification_outbox_channel_id_outcome_key_key UNIQUE (channel_id, outcome_key)
CONSTRAINT notification_outbox.notification_outbox_check CHECK (((status = ANY (ARRAY['pending'::text, 'leased'::text])) = (due_at_ms IS NOT NULL)))
CONSTRAINT notification_outbox.notification_outbox_check1 CHECK (((status = 'leased'::text) = (lease_owner IS NOT NULL)))
CONSTRAINT notification_outbox.notification_outbox_last_error_check CHECK (((last_error IS NULL) OR (length(last_error) <= 64)))
CONSTRAINT notification_outbox.notification_outbox_lease_owner_check CHECK (((lease_owner IS NULL) OR ((length(lease_owner) >= 1) AND (length(lease_owner) <= 128))))
CONSTRAINT notification_outbox.notification_outbox_outcome_key_check CHECK (((length(outcome_key) >= 1) AND (length(outcome_key) <= 256)))
CONSTRAINT notification_outbox.notification_outbox_payload_json_check CHECK ((length(payload_json) <= 4096))
CONSTRAINT notification_outbox.notification_outbox_pkey PRIMARY KEY (id)
CONSTRAINT notification_outbox.notification_outbox_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT notification_outbox.notification_outbox_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'leased'::text, 'delivered'::text, 'dead'::text])))
CONSTRAINT notification_rules.notification_rules_channel_id_fkey FOREIGN KEY (channel_id) REFERENCES notification_channels(id)
CONSTRAINT notification_rules.notification_rules_events_check CHECK (((length(events) >= 1) AND (length(events) <= 256)))
CONSTRAINT notification_rules.notification_rules_pkey PRIMARY KEY (id)
CONSTRAINT notification_rules.notification_rules_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT parked_items.parked_items_error_type_check CHECK (((error_type IS NULL) OR ((length(error_type) >= 1) AND (length(error_type) <= 64))))
CONSTRAINT parked_items.parked_items_failures_check CHECK ((failures >= 1))
CONSTRAINT parked_items.parked_items_item_key_check CHECK (((length(item_key) >= 1) AND (length(item_key) <= 128)))
CONSTRAINT parked_items.parked_items_item_kind_check CHECK (((length(item_kind) >= 1) AND (length(item_kind) <= 32)))
CONSTRAINT parked_items.parked_items_loop_check CHECK (((length(loop) >= 1) AND (length(loop) <= 32)))
CONSTRAINT parked_items.parked_items_pkey PRIMARY KEY (item_kind, item_key)
CONSTRAINT parked_items.parked_items_project_id_check CHECK (((project_id IS NULL) OR ((length(project_id) >= 1) AND (length(project_id) <= 64))))
CONSTRAINT parked_items.parked_items_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 64)))
CONSTRAINT principals.principals_is_owner_check CHECK ((is_owner = ANY (ARRAY[0, 1])))
CONSTRAINT principals.principals_issued_by_fkey FOREIGN KEY (issued_by) REFERENCES principals(id)
CONSTRAINT principals.principals_kind_check CHECK ((kind = ANY (ARRAY['user'::text, 'service'::text, 'worker'::text])))
CONSTRAINT principals.principals_pkey PRIMARY KEY (id)
CONSTRAINT principals.principals_token_digest_key UNIQUE (token_digest)
CONSTRAINT project_dependencies.project_dependencies_kind_check CHECK ((kind = ANY (ARRAY['python'::text, 'node'::text])))
CONSTRAINT project_dependencies.project_dependencies_name_check CHECK (((length(name) >= 1) AND (length(name) <= 214)))
CONSTRAINT project_dependencies.project_dependencies_pkey PRIMARY KEY (project_id, kind, name)
CONSTRAINT project_dependencies.project_dependencies_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT project_dependencies.project_dependencies_spec_check CHECK (((length(spec) >= 1) AND (length(spec) <= 200)))
CONSTRAINT project_settings.project_settings_default_tz_check CHECK (((default_tz IS NULL) OR ((length(default_tz) >= 1) AND (length(default_tz) <= 64))))
CONSTRAINT project_settings.project_settings_pkey PRIMARY KEY (project_id)
CONSTRAINT project_settings.project_settings_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT project_variables.project_variables_name_check CHECK (((length(name) >= 1) AND (length(name) <= 128)))
CONSTRAINT project_variables.project_variables_note_check CHECK ((length(note) <= 256))
CONSTRAINT project_variables.project_variables_pkey PRIMARY KEY (project_id, name)
CONSTRAINT project_variables.project_variables_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT projects.projects_name_key UNIQUE (name)
CONSTRAINT projects.projects_pkey PRIMARY KEY (id)
CONSTRAINT projects.projects_version_check CHECK ((version >= 1))
CONSTRAINT ql3_clock.ql3_clock_pkey PRIMARY KEY (singleton)
CONSTRAINT ql3_clock.ql3_clock_singleton_check CHECK (singleton)
CONSTRAINT retention_policies.retention_policies_keep_days_check CHECK (((keep_days IS NULL) OR ((keep_days >= 1) AND (keep_days <= 36500))))
CONSTRAINT retention_policies.retention_policies_log_bytes_per_run_check CHECK (((log_bytes_per_run IS NULL) OR ((log_bytes_per_run >= 1024) AND (log_bytes_per_run <= '1099511627776'::bigint))))
CONSTRAINT retention_policies.retention_policies_pkey PRIMARY KEY (project_id)
CONSTRAINT retention_policies.retention_policies_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT retention_policies.retention_policies_runs_per_task_check CHECK (((runs_per_task IS NULL) OR ((runs_per_task >= 1) AND (runs_per_task <= 100000000))))
CONSTRAINT retention_policies.retention_policies_version_check CHECK ((version >= 1))
CONSTRAINT role_bindings.role_bindings_pkey PRIMARY KEY (principal_id, project_id)
CONSTRAINT role_bindings.role_bindings_principal_id_fkey FOREIGN KEY (principal_id) REFERENCES principals(id)
CONSTRAINT role_bindings.role_bindings_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT role_bindings.role_bindings_role_check CHECK ((role = ANY (ARRAY['viewer'::text, 'operator'::text, 'approver'::text, 'admin'::text, 'metrics'::text])))
CONSTRAINT role_bindings.role_bindings_version_check CHECK ((version >= 1))
CONSTRAINT run_attempts.run_attempts_attempt_check CHECK ((attempt >= 1))
CONSTRAINT run_attempts.run_attempts_callback_sequence_check CHECK ((callback_sequence >= 0))
CONSTRAINT run_attempts.run_attempts_pkey PRIMARY KEY (id)
CONSTRAINT run_attempts.run_attempts_run_id_attempt_key UNIQUE (run_id, attempt)
CONSTRAINT run_attempts.run_attempts_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs(id)
CONSTRAINT run_events.run_events_pkey PRIMARY KEY (id)
CONSTRAINT run_events.run_events_run_id_dedupe_key_key UNIQUE (run_id, dedupe_key)
CONSTRAINT run_events.run_events_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs(id)
CONSTRAINT run_events.run_events_run_id_sequence_key UNIQUE (run_id, sequence)
CONSTRAINT run_events.run_events_sequence_check CHECK ((sequence >= 1))
CONSTRAINT run_leases.run_leases_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES run_attempts(id)
CONSTRAINT run_leases.run_leases_check CHECK (((expires_at_ms > renewed_at_ms) AND (renewed_at_ms >= acquired_at_ms)))
CONSTRAINT run_leases.run_leases_check1 CHECK ((((status = 'leased'::text) AND (released_at_ms IS NULL) AND (release_reason IS NULL) AND (completed_at_ms IS NULL)) OR ((status = 'released'::text) AND (released_at_ms IS NOT NULL) AND (release_reason IS NOT NULL) AND (completed_at_ms IS NULL)) OR ((status = 'completed'::text) AND (completed_at_ms IS NOT NULL) AND (released_at_ms IS NULL) AND (release_reason IS NULL))))
CONSTRAINT run_leases.run_leases_lease_generation_check CHECK ((lease_generation >= 1))
CONSTRAINT run_leases.run_leases_pkey PRIMARY KEY (attempt_id)
CONSTRAINT run_leases.run_leases_release_reason_check CHECK ((release_reason = ANY (ARRAY['declined'::text, 'shutdown'::text, 'start_failed'::text, 'capacity_changed'::text, 'lease_expired'::text])))
CONSTRAINT run_leases.run_leases_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs(id)
CONSTRAINT run_leases.run_leases_status_check CHECK ((status = ANY (ARRAY['leased'::text, 'released'::text, 'completed'::text])))
CONSTRAINT run_leases.run_leases_version_check CHECK ((version >= 0))
CONSTRAINT run_retry_policies.run_retry_policies_check CHECK ((NOT ((retry_on_lost = 1) AND (safety = 'unknown'::text))))
CONSTRAINT run_retry_policies.run_retry_policies_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 16)))
CONSTRAINT run_retry_policies.run_retry_policies_pkey PRIMARY KEY (run_id)
CONSTRAINT run_retry_policies.run_retry_policies_retry_on_lost_check CHECK ((retry_on_lost = ANY (ARRAY[0, 1])))
CONSTRAINT run_retry_policies.run_retry_policies_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs(id)
CONSTRAINT run_retry_policies.run_retry_policies_safety_check CHECK ((safety = ANY (ARRAY['unknown'::text, 'idempotent'::text, 'deduplicated'::text])))
CONSTRAINT run_retry_policies.run_retry_policies_version_check CHECK ((version >= 0))
CONSTRAINT runs.runs_cancel_reason_check CHECK ((cancel_reason = ANY (ARRAY['user'::text, 'policy'::text, 'shutdown'::text, 'reconcile'::text, 'timeout'::text])))
CONSTRAINT runs.runs_event_sequence_check CHECK ((event_sequence >= 0))
CONSTRAINT runs.runs_pkey PRIMARY KEY (id)
CONSTRAINT runs.runs_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT runs.runs_project_id_id_key UNIQUE (project_id, id)
CONSTRAINT runs.runs_request_digest_check CHECK (((request_digest IS NULL) OR (request_digest ~ '^[0-9a-f]{64}$'::text)))
CONSTRAINT runs.runs_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT runs.runs_task_id_task_revision_fkey FOREIGN KEY (task_id, task_revision) REFERENCES task_revisions(task_id, revision)
CONSTRAINT runs.runs_version_check CHECK ((version >= 0))
CONSTRAINT script_revisions.script_revisions_author_check CHECK (((length(author) >= 1) AND (length(author) <= 200)))
CONSTRAINT script_revisions.script_revisions_check CHECK (((content IS NULL) = (digest IS NULL)))
CONSTRAINT script_revisions.script_revisions_content_check CHECK (((content IS NULL) OR (length(content) <= 262144)))
CONSTRAINT script_revisions.script_revisions_digest_check CHECK (((digest IS NULL) OR (length(digest) = 64)))
CONSTRAINT script_revisions.script_revisions_path_check CHECK (((length(path) >= 1) AND (length(path) <= 255)))
CONSTRAINT script_revisions.script_revisions_pkey PRIMARY KEY (project_id, path, revision)
CONSTRAINT script_revisions.script_revisions_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT script_revisions.script_revisions_revision_check CHECK ((revision >= 1))
CONSTRAINT script_revisions.script_revisions_source_check CHECK (((length(source) >= 1) AND (length(source) <= 100)))
CONSTRAINT scripts.scripts_digest_check CHECK ((length(digest) = 64))
CONSTRAINT scripts.scripts_path_check CHECK (((length(path) >= 1) AND (length(path) <= 255)))
CONSTRAINT scripts.scripts_pkey PRIMARY KEY (project_id, path)
CONSTRAINT scripts.scripts_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT scripts.scripts_revision_check CHECK ((revision >= 1))
CONSTRAINT scripts.scripts_size_bytes_check CHECK (((size_bytes >= 0) AND (size_bytes <= 262144)))
CONSTRAINT scripts.scripts_updated_by_check CHECK (((length(updated_by) >= 1) AND (length(updated_by) <= 200)))
CONSTRAINT server_keys.server_keys_key_hex_check CHECK ((length(key_hex) >= 64))
CONSTRAINT server_keys.server_keys_pkey PRIMARY KEY (name)
CONSTRAINT subscription_files.subscription_files_path_check CHECK (((length(path) >= 1) AND (length(path) <= 255)))
CONSTRAINT subscription_files.subscription_files_pkey PRIMARY KEY (subscription_id, path)
CONSTRAINT subscription_files.subscription_files_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES subscriptions(id) ON DELETE CASCADE
CONSTRAINT subscription_files.subscription_files_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT subscription_syncs.subscription_syncs_commit_sha_check CHECK (((commit_sha IS NULL) OR ((length(commit_sha) >= 1) AND (length(commit_sha) <= 64))))
CONSTRAINT subscription_syncs.subscription_syncs_log_check CHECK ((length(log) <= 65536))
CONSTRAINT subscription_syncs.subscription_syncs_pkey PRIMARY KEY (id)
CONSTRAINT subscription_syncs.subscription_syncs_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT subscription_syncs.subscription_syncs_status_check CHECK ((status = ANY (ARRAY['running'::text, 'succeeded'::text, 'failed'::text])))
CONSTRAINT subscription_syncs.subscription_syncs_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES subscriptions(id) ON DELETE CASCADE
CONSTRAINT subscription_syncs.subscription_syncs_summary_check CHECK (((summary IS NULL) OR (length(summary) <= 2000)))
CONSTRAINT subscription_syncs.subscription_syncs_trigger_type_check CHECK ((trigger_type = ANY (ARRAY['manual'::text, 'schedule'::text])))
CONSTRAINT subscriptions.subscriptions_branch_check CHECK (((branch IS NULL) OR ((length(branch) >= 1) AND (length(branch) <= 255))))
CONSTRAINT subscriptions.subscriptions_cron_check CHECK (((cron IS NULL) OR ((length(cron) >= 1) AND (length(cron) <= 256))))
CONSTRAINT subscriptions.subscriptions_deploy_key_check CHECK (((deploy_key IS NULL) OR ((length(deploy_key) >= 1) AND (length(deploy_key) <= 16384))))
CONSTRAINT subscriptions.subscriptions_name_check CHECK (((length(name) >= 1) AND (length(name) <= 128)))
CONSTRAINT subscriptions.subscriptions_path_glob_check CHECK (((path_glob IS NULL) OR ((length(path_glob) >= 1) AND (length(path_glob) <= 255))))
CONSTRAINT subscriptions.subscriptions_pkey PRIMARY KEY (id)
CONSTRAINT subscriptions.subscriptions_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT subscriptions.subscriptions_project_id_name_key UNIQUE (project_id, name)
CONSTRAINT subscriptions.subscriptions_repo_url_check CHECK (((length(repo_url) >= 1) AND (length(repo_url) <= 2048)))
CONSTRAINT task_revisions.task_revisions_pkey PRIMARY KEY (task_id, revision)
CONSTRAINT task_revisions.task_revisions_revision_check CHECK ((revision >= 1))
CONSTRAINT task_revisions.task_revisions_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT task_schedules.task_schedules_pkey PRIMARY KEY (task_id)
CONSTRAINT task_schedules.task_schedules_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT task_schedules.task_schedules_state_version_check CHECK ((state_version >= 0))
CONSTRAINT task_schedules.task_schedules_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT tasks.tasks_enabled_check CHECK ((enabled = ANY (ARRAY[0, 1])))
CONSTRAINT tasks.tasks_pkey PRIMARY KEY (id)
CONSTRAINT tasks.tasks_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT tasks.tasks_revision_check CHECK ((revision >= 1))
CONSTRAINT user_logins.user_logins_failed_count_check CHECK ((failed_count >= 0))
CONSTRAINT user_logins.user_logins_login_check CHECK (((length(login) >= 1) AND (length(login) <= 128)))
CONSTRAINT user_logins.user_logins_login_key UNIQUE (login)
CONSTRAINT user_logins.user_logins_password_hash_check CHECK (((length(password_hash) >= 1) AND (length(password_hash) <= 512)))
CONSTRAINT user_logins.user_logins_pkey PRIMARY KEY (principal_id)
CONSTRAINT user_logins.user_logins_principal_id_fkey FOREIGN KEY (principal_id) REFERENCES principals(id)
CONSTRAINT user_logins.user_logins_totp_sealed_check CHECK (((totp_sealed IS NULL) OR ((length(totp_sealed) >= 1) AND (length(totp_sealed) <= 512))))
CONSTRAINT user_sessions.user_sessions_check CHECK (((expires_at_ms > created_at_ms) AND (last_seen_at_ms >= created_at_ms)))
CONSTRAINT user_sessions.user_sessions_client_check CHECK ((length(client) <= 64))
CONSTRAINT user_sessions.user_sessions_idle_timeout_ms_check CHECK ((idle_timeout_ms >= 1000))
CONSTRAINT user_sessions.user_sessions_pkey PRIMARY KEY (id)
CONSTRAINT user_sessions.user_sessions_principal_id_fkey FOREIGN KEY (principal_id) REFERENCES principals(id)
CONSTRAINT user_sessions.user_sessions_secret_digest_check CHECK ((length(secret_digest) = 64))
CONSTRAINT user_sessions.user_sessions_secret_digest_key UNIQUE (secret_digest)
CONSTRAINT user_sessions.user_sessions_user_agent_check CHECK ((length(user_agent) <= 256))
CONSTRAINT worker_label_approvals.worker_label_approvals_approved_by_check CHECK (((approved_by IS NULL) OR ((length(approved_by) >= 1) AND (length(approved_by) <= 64))))
CONSTRAINT worker_label_approvals.worker_label_approvals_check CHECK (((requested_labels_json IS NULL) = (requested_at_ms IS NULL)))
CONSTRAINT worker_label_approvals.worker_label_approvals_labels_json_check CHECK (((length(labels_json) >= 2) AND (length(labels_json) <= 65536)))
CONSTRAINT worker_label_approvals.worker_label_approvals_pkey PRIMARY KEY (worker_id)
CONSTRAINT worker_label_approvals.worker_label_approvals_requested_labels_json_check CHECK (((requested_labels_json IS NULL) OR ((length(requested_labels_json) >= 2) AND (length(requested_labels_json) <= 65536))))
CONSTRAINT worker_label_approvals.worker_label_approvals_worker_id_check CHECK (((length(worker_id) >= 1) AND (length(worker_id) <= 128)))
CONSTRAINT workers.workers_active_leases_check CHECK ((active_leases >= 0))
CONSTRAINT workers.workers_generation_check CHECK ((generation >= 1))
CONSTRAINT workers.workers_max_concurrent_runs_check CHECK (((max_concurrent_runs >= 1) AND (max_concurrent_runs <= 1024)))
CONSTRAINT workers.workers_pkey PRIMARY KEY (worker_id)
CONSTRAINT workers.workers_status_check CHECK ((status = ANY (ARRAY['online'::text, 'draining'::text, 'offline'::text])))
CONSTRAINT workers.workers_version_check CHECK ((version >= 0))
FUNCTION ql3_approvals_refuse_update
FUNCTION ql3_claim
FUNCTION ql3_claim_batch
FUNCTION ql3_claim_or_raise
FUNCTION ql3_fence_rows
FUNCTION ql3_lease_result
FUNCTION ql3_now_ms
FUNCTION ql3_write_run
