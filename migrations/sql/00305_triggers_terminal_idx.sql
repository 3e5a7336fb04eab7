-- +goose Up
-- `retryd maintenance` deletes the deliveries and runs whose terminal
-- status is older than their retention (runs with their steps, ON DELETE
-- CASCADE), in batches; each batch finds its rows by these indexes
-- instead of scanning the table. Their predicates are the conditions
-- maintenance uses, word for word (projections/retention). Not built
-- CONCURRENTLY (migrations run in a transaction): on large tables, writes
-- wait for the index builds.
CREATE INDEX workflow_trigger_deliveries_terminal_idx ON workflow_trigger_deliveries (updated_at)
    WHERE status IN ('launched', 'filtered', 'cancelled', 'exhausted');
CREATE INDEX workflow_runs_terminal_idx ON workflow_runs (updated_at)
    WHERE status IN ('completed', 'failed', 'failed_max_retries');

-- +goose Down
DROP INDEX IF EXISTS workflow_runs_terminal_idx;
DROP INDEX IF EXISTS workflow_trigger_deliveries_terminal_idx;
