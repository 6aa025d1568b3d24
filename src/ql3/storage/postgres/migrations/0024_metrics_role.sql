-- The metrics role (docs/operations.md "Prometheus"): a scrape token that reads /metrics with the
-- task names of its project as label values, and nothing else.
ALTER TABLE role_bindings DROP CONSTRAINT role_bindings_role_check;
ALTER TABLE role_bindings ADD CONSTRAINT role_bindings_role_check
  CHECK (role IN ('viewer', 'operator', 'approver', 'admin', 'metrics'));
