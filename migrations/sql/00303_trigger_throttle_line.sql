-- +goose Up
-- Throttled deliveries wait in a line per trigger and throttle key, each
-- at its own slot (next_attempt_at): the next one in line reads the last
-- slots taken through this index instead of every held delivery.
CREATE INDEX workflow_trigger_deliveries_throttle_line_idx
    ON workflow_trigger_deliveries (trigger_id, throttle_key, next_attempt_at)
    WHERE status = 'throttled';

-- +goose Down
DROP INDEX IF EXISTS workflow_trigger_deliveries_throttle_line_idx;
