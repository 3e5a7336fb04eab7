-- +goose Up
-- Ingress: track which deferral attempt the scheduler confirmed, so the
-- reconciler can find deferrals whose failed event never reached the
-- scheduler (RETRIES purged, scheduler state restored) and publish it again.
ALTER TABLE event_ingress_retries
    ADD COLUMN scheduled_attempt integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT event_ingress_retries_state_check
        CHECK (retry_state IN ('scheduled', 'due', 'completed', 'cancelled', 'exhausted'));

-- Deferrals waiting for the scheduler's scheduled/rescheduled confirmation.
CREATE INDEX event_ingress_retries_unconfirmed_idx ON event_ingress_retries (updated_at)
    WHERE retry_state = 'scheduled' AND scheduled_attempt <= attempts;

-- Operator views: deferred events per source.
CREATE INDEX workflow_events_deferred_idx ON workflow_events (source, received_at)
    WHERE status = 'deferred';

-- +goose Down
DROP INDEX IF EXISTS workflow_events_deferred_idx;
DROP INDEX IF EXISTS event_ingress_retries_unconfirmed_idx;
ALTER TABLE event_ingress_retries
    DROP CONSTRAINT IF EXISTS event_ingress_retries_state_check,
    DROP COLUMN IF EXISTS scheduled_attempt;
