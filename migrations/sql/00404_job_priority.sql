-- +goose Up
-- A job's priority band (seed 004's priority): high, normal or low, from
-- its job message (jobs.<job_type> is normal, jobs.<job_type>.high and
-- .low the others) or its failed and held facts. Jobs from before
-- priorities are normal.
ALTER TABLE jobs ADD COLUMN priority text NOT NULL DEFAULT 'normal'
    CHECK (priority IN ('high', 'normal', 'low'));

-- +goose Down
ALTER TABLE jobs DROP COLUMN priority;
