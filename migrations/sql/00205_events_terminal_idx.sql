-- +goose Up
-- `retryd maintenance` deletes the events whose terminal status (admitted,
-- cancelled, exhausted) is older than their retention, with their
-- event_ingress_retries row (ON DELETE CASCADE), in batches; each batch
-- finds its rows by this index instead of scanning the table. Its
-- predicate is the condition maintenance uses, word for word
-- (projections/retention). Not built CONCURRENTLY (migrations run in a
-- transaction): on a large table, writes wait for one index build.
CREATE INDEX workflow_events_terminal_idx ON workflow_events (updated_at)
    WHERE status IN ('admitted', 'cancelled', 'exhausted');

-- +goose Down
DROP INDEX IF EXISTS workflow_events_terminal_idx;
