-- PostgreSQL overrides of src/ql3/storage/sql/cluster.sql.

-- A transaction-scoped advisory lock: concurrent first starts of replicas create one owner.
-- name: cluster_bootstrap_lock
-- desc: Takes a transaction-scoped advisory lock so concurrent replica first starts create one owner.
SELECT pg_advisory_xact_lock(7303311) IS NOT NULL AS locked
