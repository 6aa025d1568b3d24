-- The console's delivery history reads a project's outbox newest first, one keyset page at a time.
CREATE INDEX notification_outbox_project_created ON notification_outbox (project_id, created_at_ms, id);
