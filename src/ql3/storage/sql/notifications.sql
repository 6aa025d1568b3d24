-- Notification channels, rules and the transactional outbox (docs/notifications.md).
-- Only notify_channel_target (read by the delivery loop) selects a channel's target or secret.

-- name: notify_channel_insert
-- desc: Creates a notification channel with its target and secret; no row when the name is taken.
INSERT INTO notification_channels (id, project_id, name, kind, target, secret, scheme, created_at_ms)
VALUES (:id, :project_id, :name, :kind, :target, :secret, :scheme, :now)
ON CONFLICT DO NOTHING

-- name: notify_channel_count
-- desc: How many channels a project has, to enforce the per-project limit.
SELECT count(*) AS n FROM notification_channels WHERE project_id = :project_id

-- name: notify_channel_list
-- desc: A project's channels by name without target or secret (at most 64).
SELECT id, project_id, name, kind, scheme, created_at_ms FROM notification_channels
WHERE project_id = :project_id ORDER BY name LIMIT 64

-- name: notify_channel_by_name
-- desc: One channel of a project by name, without target or secret.
SELECT id, project_id, name, kind, scheme, created_at_ms FROM notification_channels
WHERE project_id = :project_id AND name = :name

-- name: notify_channel_target
-- desc: A channel's kind, target and secret: read only by the delivery loop.
SELECT id, kind, target, secret FROM notification_channels WHERE id = :id

-- name: notify_channel_delete
-- desc: Deletes a channel of a project.
DELETE FROM notification_channels WHERE id = :id AND project_id = :project_id

-- name: notify_rules_delete_for_channel
-- desc: Deletes the rules that send to a channel, before the channel goes.
DELETE FROM notification_rules WHERE channel_id = :channel_id

-- name: notify_outbox_drop_unsent
-- desc: Drops a channel's pending and leased outbox rows, so a deleted channel gets nothing more.
DELETE FROM notification_outbox WHERE channel_id = :channel_id AND status IN ('pending', 'leased')

-- name: notify_rule_insert
-- desc: Creates a notification rule: which task's events go to which channel.
INSERT INTO notification_rules (id, project_id, channel_id, task_id, events, created_at_ms)
VALUES (:id, :project_id, :channel_id, :task_id, :events, :now)

-- name: notify_rule_count
-- desc: How many rules a project has, to enforce the per-project limit.
SELECT count(*) AS n FROM notification_rules WHERE project_id = :project_id

-- name: notify_rules_for_project
-- desc: A project's rules in creation order (at most 64), to list them and match run outcomes.
SELECT id, project_id, channel_id, task_id, events, created_at_ms FROM notification_rules
WHERE project_id = :project_id ORDER BY created_at_ms, id LIMIT 64

-- name: notify_rule_delete
-- desc: Deletes a rule of a project.
DELETE FROM notification_rules WHERE id = :id AND project_id = :project_id

-- name: notify_outbox_insert
-- desc: Queues a notification for a channel once per outcome key (a duplicate is ignored).
INSERT INTO notification_outbox (id, project_id, channel_id, outcome_key, event, payload_json, status, attempts,
  due_at_ms, created_at_ms, updated_at_ms)
VALUES (:id, :project_id, :channel_id, :outcome_key, :event, :payload_json, 'pending', 0, :now, :now, :now)
ON CONFLICT (channel_id, outcome_key) DO NOTHING

-- name: notify_outbox_get
-- desc: One outbox row by id.
SELECT * FROM notification_outbox WHERE id = :id

-- name: notify_outbox_get_in_project
-- desc: One outbox row by id only if it belongs to the project.
SELECT * FROM notification_outbox WHERE id = :id AND project_id = :project_id

-- name: notify_outbox_claim
-- desc: Leases a due outbox row for delivery and counts the attempt, CAS on its attempt count.
UPDATE notification_outbox SET status = 'leased', attempts = attempts + 1, due_at_ms = :lease_expires_at_ms,
  lease_owner = :owner, updated_at_ms = :now
WHERE id = :id AND attempts = :expected_attempts AND status IN ('pending', 'leased') AND due_at_ms <= :now

-- name: notify_outbox_settle
-- desc: Records a delivery's result (sent, retry later, failed) under the claimer's lease and attempt count.
UPDATE notification_outbox SET status = :status, due_at_ms = :due_at_ms, lease_owner = NULL,
  last_error = :last_error, updated_at_ms = :now
WHERE id = :id AND status = 'leased' AND lease_owner = :owner AND attempts = :expected_attempts

-- name: notify_next_due
-- desc: The earliest due time in the outbox: when the delivery loop must wake.
SELECT min(due_at_ms) AS due FROM notification_outbox WHERE due_at_ms IS NOT NULL

-- name: notify_outbox_counts
-- desc: Outbox rows counted by status, for /metrics.
SELECT status, count(*) AS n FROM notification_outbox GROUP BY status

-- name: notify_outbox_count_outcomes
-- desc: How many distinct outcomes with keys in [lo, hi) a project's outbox holds: the messages one attempt sent.
SELECT count(DISTINCT outcome_key) AS n FROM notification_outbox
WHERE project_id = :project_id AND outcome_key >= :lo AND outcome_key < :hi

-- name: notify_outbox_history
-- desc: A project's deliveries newest first, keyset-paged by (created_at_ms, id), with the channel's name.
SELECT o.id, o.channel_id, c.name AS channel_name, o.event, o.status, o.attempts, o.last_error,
  o.created_at_ms, o.updated_at_ms
FROM notification_outbox o LEFT JOIN notification_channels c ON c.id = o.channel_id
WHERE o.project_id = :project_id
  AND (o.created_at_ms < :before_ms OR (o.created_at_ms = :before_ms AND o.id < :before_id))
ORDER BY o.created_at_ms DESC, o.id DESC LIMIT :limit
