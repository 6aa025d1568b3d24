-- The server start epoch of --on-start tasks (docs/cron.md): one row. A start that finds no server
-- running (the last one stopped cleanly, or none ever ran) opens a new epoch; a start after a crash
-- (running still set) keeps the epoch, so a crash loop fires each --on-start task once, not per restart.
CREATE TABLE cron_start_epoch (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  epoch INTEGER NOT NULL CHECK (epoch >= 1),
  running INTEGER NOT NULL CHECK (running IN (0, 1)),
  updated_at_ms BIGINT NOT NULL
);
