-- +goose Up
-- `retryd maintenance` deletes the retries whose terminal state is older
-- than their retention (projections/retention), in batches; each batch
-- finds its rows by this index instead of scanning the table. Its
-- predicate is the condition maintenance uses, word for word.
-- Migrations run in a transaction, so this is not built CONCURRENTLY:
-- on a large table writes to it wait for one index build (schedule the
-- upgrade like any index build).
CREATE INDEX retries_terminal_idx ON retries (resolved_at)
    WHERE state IN ('succeeded', 'exhausted', 'cancelled');

-- +goose Down
DROP INDEX IF EXISTS retries_terminal_idx;
