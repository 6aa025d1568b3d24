-- The labels a remote worker may register with (docs/security.md "A remote worker"): one row per
-- worker id. A worker credential registers a session only with exactly these labels; the first
-- registration binds them (approved_by NULL), a token minted with labels or `ql3 worker approve` by
-- an admin sets them (approved_by: that principal). A refused registration leaves its labels as the
-- pending request an admin may approve. Labels are canonical JSON objects, checked by the application.
CREATE TABLE worker_label_approvals (
  worker_id TEXT PRIMARY KEY CHECK (length(worker_id) BETWEEN 1 AND 128),
  labels_json TEXT NOT NULL CHECK (length(labels_json) BETWEEN 2 AND 65536),
  approved_by TEXT CHECK (approved_by IS NULL OR length(approved_by) BETWEEN 1 AND 64),
  approved_at_ms INTEGER NOT NULL,
  requested_labels_json TEXT
    CHECK (requested_labels_json IS NULL OR length(requested_labels_json) BETWEEN 2 AND 65536),
  requested_at_ms INTEGER,
  CHECK ((requested_labels_json IS NULL) = (requested_at_ms IS NULL))
) WITHOUT ROWID;
