-- +goose Up
-- The due emission writes a history row for every retry that comes due,
-- and every index on retry_history is work on that path. The analytics
-- read only failed attempts of jobs over a period, so one partial index
-- over those rows replaces the two that indexed every row (by time, and
-- by job type and time). One item's history keeps retry_history_item_idx.
DROP INDEX IF EXISTS retry_history_at_idx;
DROP INDEX IF EXISTS retry_history_job_type_idx;
CREATE INDEX retry_history_job_failures_idx ON retry_history (at)
    WHERE kind = 'job' AND event = 'failed' AND job_type <> '';

-- +goose Down
DROP INDEX IF EXISTS retry_history_job_failures_idx;
CREATE INDEX IF NOT EXISTS retry_history_at_idx ON retry_history (at);
CREATE INDEX IF NOT EXISTS retry_history_job_type_idx ON retry_history (job_type, at) WHERE job_type <> '';
