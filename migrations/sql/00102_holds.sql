-- +goose Up
-- A hold is not a failure (docs/contract.md, "Holds"). A held item keeps
-- its retry budget and is limited by the policy's max_hold instead;
-- a failure's own retry-after hint is honoured up to max_retry_after,
-- no longer capped at max_delay_ms.
ALTER TABLE retry_policies
    ADD COLUMN max_hold_ms        bigint NOT NULL DEFAULT 2592000000
        CHECK (max_hold_ms > 0 AND max_hold_ms <= 31622400000),
    ADD COLUMN max_retry_after_ms bigint NOT NULL DEFAULT 86400000
        CHECK (max_retry_after_ms > 0 AND max_retry_after_ms <= 31622400000);

-- held_since: when the item's current stretch of holds began (max_hold
-- counts from it); NULL when the item is not held. hold_reason: throttle,
-- pause or concurrency. hold_key: what a release fact names to lift the
-- hold early (the source of a paused event).
ALTER TABLE retries
    ADD COLUMN held_since  timestamptz,
    ADD COLUMN hold_reason text NOT NULL DEFAULT ''
        CHECK (hold_reason IN ('', 'throttle', 'pause', 'concurrency')),
    ADD COLUMN hold_key    text NOT NULL DEFAULT '';
CREATE INDEX retries_hold_idx ON retries (kind, hold_key, held_since)
    WHERE hold_key <> '' AND state = 'scheduled';

-- The last release (resume) of each hold key, so a hold decided before
-- the release but applied after it is released too.
CREATE TABLE retry_hold_releases (
    kind        text        NOT NULL,
    hold_key    text        NOT NULL,
    released_at timestamptz NOT NULL,
    PRIMARY KEY (kind, hold_key)
);

-- Pending items that owners held back before the held event existed were
-- recorded as failures (last_reason source_throttled, ...) and used a retry
-- each time. They get their budget back and become holds from their last
-- failure on; a paused event can then be released by a resume of its
-- source.
UPDATE retries SET
    held_since  = coalesce(last_error_at, updated_at),
    hold_reason = CASE last_reason
        WHEN 'source_paused' THEN 'pause'
        WHEN 'max_concurrency' THEN 'concurrency'
        ELSE 'throttle' END,
    hold_key    = CASE WHEN last_reason = 'source_paused' THEN source ELSE '' END,
    budget_base = greatest(attempt - 1, 0),
    retry_count = 0
WHERE state IN ('scheduled', 'due')
  AND last_reason IN ('source_throttled', 'source_paused', 'trigger_throttled', 'max_concurrency');

-- +goose Down
DROP TABLE IF EXISTS retry_hold_releases;
DROP INDEX IF EXISTS retries_hold_idx;
ALTER TABLE retries
    DROP COLUMN IF EXISTS hold_key,
    DROP COLUMN IF EXISTS hold_reason,
    DROP COLUMN IF EXISTS held_since;
ALTER TABLE retry_policies
    DROP COLUMN IF EXISTS max_retry_after_ms,
    DROP COLUMN IF EXISTS max_hold_ms;
