-- +goose Up
-- A job a worker held back (throttle, pause, max concurrency) is waiting
-- for permission, not retrying after a failure: it gets its own status so
-- operators and analytics can tell the two apart.
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('in_progress', 'completed', 'failed', 'retrying', 'held', 'failed_max_retries', 'cancelled'));

-- +goose Down
UPDATE jobs SET status = 'retrying' WHERE status = 'held';
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('in_progress', 'completed', 'failed', 'retrying', 'failed_max_retries', 'cancelled'));
