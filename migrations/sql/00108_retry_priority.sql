-- +goose Up
-- A job's priority band, as its last failed or held event carried it: the
-- due event gives it back, so the retry runs in the job's band
-- (jobs.<job_type>.high or .low; '' and 'normal' are jobs.<job_type>).
ALTER TABLE retries ADD COLUMN priority text NOT NULL DEFAULT ''
    CHECK (priority IN ('', 'high', 'normal', 'low'));

-- +goose Down
ALTER TABLE retries DROP COLUMN priority;
