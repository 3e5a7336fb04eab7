-- +goose Up
-- Triggers: why a delivery ended where it did (status_reason: which
-- predicate or limit decided, why it was cancelled), and which retry attempt
-- the scheduler confirmed (scheduled_attempt), so the reconciler can find
-- held deliveries whose failed event never reached the scheduler (RETRIES
-- purged, scheduler state restored) and publish it again.
ALTER TABLE workflow_trigger_deliveries
    ADD COLUMN status_reason text NOT NULL DEFAULT '',
    ADD COLUMN scheduled_attempt integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT workflow_trigger_deliveries_status_check
        CHECK (status IN ('launched', 'filtered', 'throttled', 'concurrency_limited', 'cancelled', 'exhausted')),
    ADD CONSTRAINT workflow_trigger_deliveries_retry_state_check
        CHECK (retry_state IN ('none', 'scheduled', 'due', 'completed', 'cancelled', 'exhausted'));

ALTER TABLE workflow_runs
    ADD CONSTRAINT workflow_runs_status_check
        CHECK (status IN ('requested', 'running', 'completed', 'failed'));

-- Operator views: a trigger's deliveries, newest first.
CREATE INDEX workflow_trigger_deliveries_trigger_idx
    ON workflow_trigger_deliveries (trigger_id, created_at DESC, delivery_id);

-- Held deliveries waiting for the scheduler's scheduled/rescheduled
-- confirmation.
CREATE INDEX workflow_trigger_deliveries_unconfirmed_idx
    ON workflow_trigger_deliveries (updated_at)
    WHERE retry_state = 'scheduled' AND scheduled_attempt <= retry_attempts;

-- +goose Down
DROP INDEX IF EXISTS workflow_trigger_deliveries_unconfirmed_idx;
DROP INDEX IF EXISTS workflow_trigger_deliveries_trigger_idx;
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_status_check;
ALTER TABLE workflow_trigger_deliveries
    DROP CONSTRAINT IF EXISTS workflow_trigger_deliveries_retry_state_check,
    DROP CONSTRAINT IF EXISTS workflow_trigger_deliveries_status_check,
    DROP COLUMN IF EXISTS scheduled_attempt,
    DROP COLUMN IF EXISTS status_reason;
