-- +goose Up
-- What the views need to show a held item as held rather than as a
-- retry due at max_hold (docs/contract.md, "Holds"; the API's `held`):
-- hold_until: when the item's current hold ends, as far as is known: the
--   owner's until, the slot a release gave it, or max_hold where the
--   decision brought the hold's time forward to it. NULL when only a
--   release (or max_hold) ends it: a pause without an end, a concurrency
--   limit, a throttle without a release time.
-- max_hold_ms: the max_hold of the decision that holds the item (counted
--   from held_since). NULL when the item's last decision was not a hold
--   (a backoff, a manual retry): then it is not held, whatever
--   held_since says.
-- Both are written with the rest of the row, by the same statement.
ALTER TABLE retries
    ADD COLUMN hold_until  timestamptz,
    ADD COLUMN max_hold_ms bigint CHECK (max_hold_ms > 0);

-- Items held now: what their last decision said. A hold decision
-- records its max_hold; a release ("resume", written by a release fact)
-- does not, so the policy's own applies. The owner's until is in the
-- held fact.
UPDATE retries r SET max_hold_ms = x.max_hold_ms, hold_until = x.hold_until
FROM (
    SELECT h.kind, h.item_id,
        coalesce((d.detail->>'max_hold_ms')::bigint,
            (SELECT p.max_hold_ms FROM retry_policies p WHERE p.name = h.policy_name ORDER BY p.kind, p.job_type LIMIT 1),
            2592000000) AS max_hold_ms,
        CASE
            WHEN d.decided_by IN ('pause_until', 'resume') OR d.detail->>'capped_by' = 'max_hold' THEN h.next_attempt_at
            WHEN d.decided_by = 'hold' AND u.until IS NOT NULL THEN h.next_attempt_at
        END AS hold_until
    FROM retries h
    LEFT JOIN LATERAL (
        SELECT e.decided_by, e.detail FROM retry_history e
        WHERE e.kind = h.kind AND e.item_id = h.item_id AND e.event IN ('scheduled', 'rescheduled')
        ORDER BY e.id DESC LIMIT 1) d ON true
    LEFT JOIN LATERAL (
        SELECT e.detail->>'until' AS until FROM retry_history e
        WHERE e.kind = h.kind AND e.item_id = h.item_id AND e.event = 'held'
        ORDER BY e.id DESC LIMIT 1) u ON true
    WHERE h.state = 'scheduled' AND h.held_since IS NOT NULL
      AND (d.decided_by IS NULL OR d.decided_by IN ('hold', 'pause_until', 'pause', 'resume', 'throttle'))
) x
WHERE r.kind = x.kind AND r.item_id = x.item_id;

-- +goose Down
ALTER TABLE retries
    DROP COLUMN IF EXISTS max_hold_ms,
    DROP COLUMN IF EXISTS hold_until;
