-- Aggregates for the console's pictures (docs/console.md "Pictures"). Each returns at most
-- buckets x statuses rows and reads only the runs of its window (runs_finished, runs_status).

-- name: stats_runs_by_bucket
-- desc: Finished runs of a project per time bucket and outcome in [start, end).
SELECT (finished_at_ms - :start_ms) / :bucket_ms AS bucket, status, COUNT(*) AS n
FROM runs
WHERE finished_at_ms >= :start_ms AND finished_at_ms < :end_ms AND project_id = :project_id
GROUP BY (finished_at_ms - :start_ms) / :bucket_ms, status

-- name: stats_busy_by_bucket
-- desc: Milliseconds of run time of a project inside each time bucket of [start, end) (running runs up to now).
WITH RECURSIVE slots (i) AS (
  SELECT 0 UNION ALL SELECT i + 1 FROM slots WHERE i + 1 < :buckets
),
spans AS (
  SELECT started_at_ms AS s, finished_at_ms AS e FROM runs
  WHERE finished_at_ms > :start_ms AND started_at_ms IS NOT NULL AND started_at_ms < :end_ms
    AND project_id = :project_id
  UNION ALL
  SELECT started_at_ms AS s, :now_ms AS e FROM runs
  WHERE status = 'running' AND finished_at_ms IS NULL AND started_at_ms IS NOT NULL
    AND started_at_ms < :end_ms AND project_id = :project_id
),
clipped AS (
  SELECT slots.i AS bucket,
    CASE WHEN spans.s > :start_ms + slots.i * :bucket_ms THEN spans.s ELSE :start_ms + slots.i * :bucket_ms END AS lo,
    CASE WHEN spans.e < :start_ms + (slots.i + 1) * :bucket_ms THEN spans.e
      ELSE :start_ms + (slots.i + 1) * :bucket_ms END AS hi
  FROM slots JOIN spans ON spans.s < :start_ms + (slots.i + 1) * :bucket_ms
    AND spans.e > :start_ms + slots.i * :bucket_ms
)
SELECT bucket, SUM(hi - lo) AS busy_ms FROM clipped WHERE hi > lo GROUP BY bucket

-- name: stats_capacity
-- desc: The slots of the workers that are online now (what the busy slots compare against).
SELECT COALESCE(SUM(max_concurrent_runs), 0) AS slots FROM workers
WHERE status = 'online' AND lease_expires_at_ms > :now_ms
