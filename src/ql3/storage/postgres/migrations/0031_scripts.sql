-- Scripts (docs/scripts.md): a project's script files, kept in the database. `scripts` holds each
-- live path's current revision; `script_revisions` every change, never rewritten, with its author and
-- source. A deletion is a revision without content (the path's row goes; its history stays).
CREATE TABLE scripts (
  project_id TEXT NOT NULL REFERENCES projects (id),
  path TEXT NOT NULL CHECK (length(path) BETWEEN 1 AND 255),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  digest TEXT NOT NULL CHECK (length(digest) = 64),
  size_bytes INTEGER NOT NULL CHECK (size_bytes BETWEEN 0 AND 262144),
  updated_at_ms BIGINT NOT NULL,
  updated_by TEXT NOT NULL CHECK (length(updated_by) BETWEEN 1 AND 200),
  PRIMARY KEY (project_id, path)
);
CREATE TABLE script_revisions (
  project_id TEXT NOT NULL REFERENCES projects (id),
  path TEXT NOT NULL CHECK (length(path) BETWEEN 1 AND 255),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  content TEXT CHECK (content IS NULL OR length(content) <= 262144),
  digest TEXT CHECK (digest IS NULL OR length(digest) = 64),
  author TEXT NOT NULL CHECK (length(author) BETWEEN 1 AND 200),
  source TEXT NOT NULL CHECK (length(source) BETWEEN 1 AND 100),
  created_at_ms BIGINT NOT NULL,
  CHECK ((content IS NULL) = (digest IS NULL)),
  PRIMARY KEY (project_id, path, revision)
);
