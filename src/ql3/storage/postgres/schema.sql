COLUMN principals.id text null=NO default=None
COLUMN principals.name text null=NO default=None
COLUMN principals.kind text null=NO default=None
COLUMN principals.is_owner integer null=NO default=0
COLUMN principals.token_digest text null=NO default=None
COLUMN principals.created_at_ms bigint null=NO default=None
COLUMN principals.disabled_at_ms bigint null=YES default=None
COLUMN projects.id text null=NO default=None
COLUMN projects.name text null=NO default=None
COLUMN projects.version bigint null=NO default=None
COLUMN projects.created_at_ms bigint null=NO default=None
COLUMN ql3_clock.singleton boolean null=NO default=true
COLUMN ql3_clock.offset_ms bigint null=NO default=0
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
COLUMN task_revisions.task_id text null=NO default=None
COLUMN task_revisions.revision integer null=NO default=None
COLUMN task_revisions.spec_json text null=NO default=None
COLUMN task_revisions.content_digest text null=NO default=None
COLUMN task_revisions.created_at_ms bigint null=NO default=None
COLUMN tasks.id text null=NO default=None
COLUMN tasks.project_id text null=NO default=None
COLUMN tasks.name text null=NO default=None
COLUMN tasks.enabled integer null=NO default=None
COLUMN tasks.revision integer null=NO default=None
COLUMN tasks.created_at_ms bigint null=NO default=None
COLUMN tasks.updated_at_ms bigint null=NO default=None
COLUMN tasks.deleted_at_ms bigint null=YES default=None
COLUMN workers.worker_id text null=NO default=None
COLUMN workers.session_id text null=NO default=None
COLUMN workers.generation integer null=NO default=None
COLUMN workers.status text null=NO default=None
COLUMN workers.version integer null=NO default=None
COLUMN workers.capabilities_json text null=NO default=None
COLUMN workers.capabilities_hash text null=NO default=None
COLUMN workers.max_concurrent_runs integer null=NO default=None
COLUMN workers.session_lease_ms bigint null=NO default=None
COLUMN workers.registered_at_ms bigint null=NO default=None
COLUMN workers.last_heartbeat_at_ms bigint null=NO default=None
COLUMN workers.lease_expires_at_ms bigint null=NO default=None
COLUMN workers.updated_at_ms bigint null=NO default=None
INDEX CREATE UNIQUE INDEX principals_pkey ON public.principals USING btree (id)
INDEX CREATE UNIQUE INDEX principals_token_digest_key ON public.principals USING btree (token_digest)
INDEX CREATE UNIQUE INDEX projects_name_key ON public.projects USING btree (name)
INDEX CREATE UNIQUE INDEX projects_pkey ON public.projects USING btree (id)
INDEX CREATE UNIQUE INDEX ql3_clock_pkey ON public.ql3_clock USING btree (singleton)
INDEX CREATE UNIQUE INDEX role_bindings_pkey ON public.role_bindings USING btree (principal_id, project_id)
INDEX CREATE INDEX run_attempts_deadline ON public.run_attempts USING btree (status, deadline_at_ms, id)
INDEX CREATE UNIQUE INDEX run_attempts_pkey ON public.run_attempts USING btree (id)
INDEX CREATE UNIQUE INDEX run_attempts_run_id_attempt_key ON public.run_attempts USING btree (run_id, attempt)
INDEX CREATE INDEX run_attempts_status ON public.run_attempts USING btree (status, created_at_ms)
INDEX CREATE UNIQUE INDEX run_events_pkey ON public.run_events USING btree (id)
INDEX CREATE UNIQUE INDEX run_events_run_id_dedupe_key_key ON public.run_events USING btree (run_id, dedupe_key)
INDEX CREATE UNIQUE INDEX run_events_run_id_sequence_key ON public.run_events USING btree (run_id, sequence)
INDEX CREATE INDEX run_leases_expiry ON public.run_leases USING btree (status, expires_at_ms, attempt_id)
INDEX CREATE UNIQUE INDEX run_leases_pkey ON public.run_leases USING btree (attempt_id)
INDEX CREATE INDEX run_leases_worker ON public.run_leases USING btree (worker_id, status)
INDEX CREATE INDEX run_retry_due ON public.run_retry_policies USING btree (next_retry_at_ms) WHERE (next_retry_at_ms IS NOT NULL)
INDEX CREATE UNIQUE INDEX run_retry_policies_pkey ON public.run_retry_policies USING btree (run_id)
INDEX CREATE INDEX runs_dispatch_candidates ON public.runs USING btree (status, priority DESC, queued_at_ms, id)
INDEX CREATE UNIQUE INDEX runs_idempotency ON public.runs USING btree (project_id, idempotency_key) WHERE (idempotency_key IS NOT NULL)
INDEX CREATE UNIQUE INDEX runs_pkey ON public.runs USING btree (id)
INDEX CREATE INDEX runs_project_created ON public.runs USING btree (project_id, created_at_ms, id)
INDEX CREATE UNIQUE INDEX runs_project_id_id_key ON public.runs USING btree (project_id, id)
INDEX CREATE INDEX runs_status_cancel ON public.runs USING btree (status, cancel_requested_at_ms)
INDEX CREATE INDEX runs_status_queued ON public.runs USING btree (status, queued_at_ms)
INDEX CREATE INDEX runs_task_created ON public.runs USING btree (task_id, created_at_ms)
INDEX CREATE UNIQUE INDEX task_revisions_pkey ON public.task_revisions USING btree (task_id, revision)
INDEX CREATE UNIQUE INDEX tasks_live_name ON public.tasks USING btree (project_id, name) WHERE (deleted_at_ms IS NULL)
INDEX CREATE UNIQUE INDEX tasks_pkey ON public.tasks USING btree (id)
INDEX CREATE INDEX tasks_project ON public.tasks USING btree (project_id, created_at_ms, id)
INDEX CREATE UNIQUE INDEX workers_pkey ON public.workers USING btree (worker_id)
INDEX CREATE INDEX workers_status ON public.workers USING btree (status, worker_id)
CONSTRAINT principals.principals_is_owner_check CHECK ((is_owner = ANY (ARRAY[0, 1])))
CONSTRAINT principals.principals_kind_check CHECK ((kind = ANY (ARRAY['user'::text, 'service'::text, 'worker'::text])))
CONSTRAINT principals.principals_pkey PRIMARY KEY (id)
CONSTRAINT principals.principals_token_digest_key UNIQUE (token_digest)
CONSTRAINT projects.projects_name_key UNIQUE (name)
CONSTRAINT projects.projects_pkey PRIMARY KEY (id)
CONSTRAINT projects.projects_version_check CHECK ((version >= 1))
CONSTRAINT ql3_clock.ql3_clock_pkey PRIMARY KEY (singleton)
CONSTRAINT ql3_clock.ql3_clock_singleton_check CHECK (singleton)
CONSTRAINT role_bindings.role_bindings_pkey PRIMARY KEY (principal_id, project_id)
CONSTRAINT role_bindings.role_bindings_principal_id_fkey FOREIGN KEY (principal_id) REFERENCES principals(id)
CONSTRAINT role_bindings.role_bindings_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT role_bindings.role_bindings_role_check CHECK ((role = ANY (ARRAY['viewer'::text, 'operator'::text, 'approver'::text, 'admin'::text])))
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
CONSTRAINT runs.runs_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT runs.runs_task_id_task_revision_fkey FOREIGN KEY (task_id, task_revision) REFERENCES task_revisions(task_id, revision)
CONSTRAINT runs.runs_version_check CHECK ((version >= 0))
CONSTRAINT task_revisions.task_revisions_pkey PRIMARY KEY (task_id, revision)
CONSTRAINT task_revisions.task_revisions_revision_check CHECK ((revision >= 1))
CONSTRAINT task_revisions.task_revisions_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks(id)
CONSTRAINT tasks.tasks_enabled_check CHECK ((enabled = ANY (ARRAY[0, 1])))
CONSTRAINT tasks.tasks_pkey PRIMARY KEY (id)
CONSTRAINT tasks.tasks_project_id_fkey FOREIGN KEY (project_id) REFERENCES projects(id)
CONSTRAINT tasks.tasks_revision_check CHECK ((revision >= 1))
CONSTRAINT workers.workers_generation_check CHECK ((generation >= 1))
CONSTRAINT workers.workers_max_concurrent_runs_check CHECK (((max_concurrent_runs >= 1) AND (max_concurrent_runs <= 1024)))
CONSTRAINT workers.workers_pkey PRIMARY KEY (worker_id)
CONSTRAINT workers.workers_status_check CHECK ((status = ANY (ARRAY['online'::text, 'draining'::text, 'offline'::text])))
CONSTRAINT workers.workers_version_check CHECK ((version >= 0))
FUNCTION ql3_now_ms
