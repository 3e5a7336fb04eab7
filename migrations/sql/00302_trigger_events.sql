-- +goose Up
-- Triggers' own copy of the events it holds deliveries for. A held
-- delivery's due normally carries the event in its payload; when the
-- event was too large to embed, or the held fact was lost and the
-- reconcile pass publishes it again, triggers reads the event here
-- instead of reading ingress's workflow_events (no service reads another
-- one's tables). A row lives while any delivery of its event is held, or
-- exhausted or cancelled (an operator may retry those); the reconcile pass
-- prunes the rest.
CREATE TABLE trigger_events (
    event_id  text        PRIMARY KEY,
    envelope  json        NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now()
);

-- Deliveries held before this migration: their events from ingress's
-- table, once, here where both tables are in one database.
INSERT INTO trigger_events (event_id, envelope)
SELECT DISTINCT ON (e.event_id) e.event_id, e.envelope
FROM workflow_trigger_deliveries d
JOIN workflow_events e ON e.event_id = d.event_id
WHERE d.status IN ('throttled', 'concurrency_limited', 'exhausted', 'cancelled')
ON CONFLICT (event_id) DO NOTHING;

-- +goose Down
DROP TABLE IF EXISTS trigger_events;
