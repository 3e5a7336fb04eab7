-- +goose Up
-- `retryd maintenance` deletes the jobs whose terminal status is older
-- than their retention (projections/retention), in batches, by updated_at
-- (the last fact that changed the row, so at or after the terminal one);
-- each batch finds its rows by this index instead of scanning the table.
-- Its predicate is the condition maintenance uses, word for word.
-- Migrations run in a transaction, so this is not built CONCURRENTLY:
-- on a large table writes to it wait for one index build (schedule the
-- upgrade like any index build).
CREATE INDEX jobs_terminal_idx ON jobs (updated_at)
    WHERE status IN ('completed', 'failed', 'failed_max_retries', 'cancelled');

-- +goose Down
DROP INDEX IF EXISTS jobs_terminal_idx;
