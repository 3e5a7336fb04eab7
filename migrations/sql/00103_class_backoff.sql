-- +goose Up
-- Each error class may have its own backoff, e.g.
-- {"rate_limit": {"base_delay_ms": 60000, "max_delay_ms": 3600000},
--  "network": {"base_delay_ms": 200, "max_delay_ms": 2000},
--  "timeout": {"first_delay_ms": 0}}. Fields left out keep the policy's;
-- first_delay_ms is the first retry's delay, exactly. The scheduler's
-- policy API validates the entries; the database only keeps an object.
ALTER TABLE retry_policies
    ADD COLUMN class_backoff jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(class_backoff) = 'object');

-- +goose Down
ALTER TABLE retry_policies DROP COLUMN IF EXISTS class_backoff;
