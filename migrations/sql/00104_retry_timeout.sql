-- +goose Up
-- A job's own timeout, as its last failed or held event carried it: the
-- due event gives it back with max_retries_override and retry_enabled, so
-- the job that runs again has its overrides without a round trip through
-- metadata.
ALTER TABLE retries ADD COLUMN timeout_ms bigint
    CHECK (timeout_ms IS NULL OR timeout_ms BETWEEN 1 AND 86400000);

-- +goose Down
ALTER TABLE retries DROP COLUMN timeout_ms;
