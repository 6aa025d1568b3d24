-- A subscription's sync is a run of its project's task ql3-sync-NAME (docs/scripts.md "Subscriptions"):
-- the sync's record names that run. NULL for syncs made before this migration and for syncs made
-- without a run (none are, since).
ALTER TABLE subscription_syncs ADD COLUMN run_id TEXT;
