-- A project's dependencies (docs/dependencies.md).

-- name: deps_upsert
-- desc: Adds a dependency to a project's set, or replaces the spec of the one with the same kind and name.
INSERT INTO project_dependencies (project_id, kind, name, spec, created_at_ms, updated_at_ms)
VALUES (:project_id, :kind, :name, :spec, :now, :now)
ON CONFLICT (project_id, kind, name) DO UPDATE SET spec = excluded.spec, updated_at_ms = excluded.updated_at_ms

-- name: deps_delete
-- desc: Removes one dependency of a project by kind and name.
DELETE FROM project_dependencies WHERE project_id = :project_id AND kind = :kind AND name = :name

-- name: deps_list
-- desc: A project's whole dependency set by kind and name (bounded by the per-project limit).
SELECT kind, name, spec, created_at_ms, updated_at_ms FROM project_dependencies
WHERE project_id = :project_id ORDER BY kind, name LIMIT 1000

-- name: deps_count
-- desc: How many dependencies a project has, to enforce the per-project limit.
SELECT count(*) AS n FROM project_dependencies WHERE project_id = :project_id
