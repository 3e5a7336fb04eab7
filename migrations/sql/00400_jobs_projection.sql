-- +goose Up
-- Jobs projection: what the jobs table needs to be folded
-- from two streams that arrive in any order, the error normalizer the
-- analytics group by, and durable bulk-retry operations.

-- The *_seq columns order the facts of one job across the JOBS and
-- RETRIES streams, which arrive in any order: a fact's position is
-- attempt * 8 + rank (scheduled 1, job message 2, failed 3,
-- succeeded/exhausted 4, cancelled 5). Each group of columns keeps the
-- position of the fact that last set it and only a newer fact changes it:
-- state_seq for status, next_retry_at, status_reason and completed_at;
-- decision_seq for retry_count, max_retries and retry_enabled;
-- checkpoint_seq for checkpoint and current_step; last_error_seq for the
-- last error. So the row ends the same whatever order facts arrive in.
ALTER TABLE jobs
    ADD COLUMN state_seq          bigint  NOT NULL DEFAULT 0,
    ADD COLUMN decision_seq       bigint  NOT NULL DEFAULT 0,
    ADD COLUMN checkpoint_seq     bigint  NOT NULL DEFAULT 0,
    ADD COLUMN last_error_seq     bigint  NOT NULL DEFAULT 0,
    ADD COLUMN status_reason      text    NOT NULL DEFAULT '',
    ADD COLUMN checkpoint         json,
    ADD CONSTRAINT jobs_status_check
        CHECK (status IN ('in_progress', 'completed', 'failed', 'retrying', 'failed_max_retries', 'cancelled'));

-- Analytics by job type and period; escalation lists by status.
CREATE INDEX jobs_created_idx ON jobs (job_type, created_at);
CREATE INDEX jobs_status_updated_idx ON jobs (status, updated_at DESC, job_id DESC);

-- retryd_normalize_error turns an error message into its pattern: URLs
-- keep their host, and e-mail addresses, timestamps, UUIDs, ids (tokens of
-- 10+ characters mixing letters and digits) and numbers become
-- placeholders, so "user 01HZX3K5Q8V2N4M6P7R9S0T1W2 timed out after 3000ms"
-- and the same failure for another user group together.
-- +goose StatementBegin
CREATE FUNCTION retryd_normalize_error(msg text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT left(btrim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(msg,
        '(https?://[^/\s?#]+)[^\s]*', '\1/<path>', 'g'),
        '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}', '<email>', 'g'),
        '\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}(:?\d{2})?)?', '<time>', 'g'),
        '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
        '\m(?=[A-Za-z_-]*[0-9])(?=[0-9_-]*[A-Za-z])[A-Za-z0-9_-]{10,}', '<id>', 'g'),
        '\d+(\.\d+)?', '<n>', 'g'),
        '\s+', ' ', 'g')), 512)
$$;
-- +goose StatementEnd

-- Bulk retry operations: the filter's matches are written down as items
-- when the operation is created, then released at rate_per_second by the
-- jobs API's runner. A runner holds the operation's lease (runner,
-- lease_until) so that one process releases it even when several serve
-- the API; a runner that dies loses the lease and another one resumes.
CREATE TABLE job_operations (
    operation_id    text        PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('bulk_retry')),
    status          text        NOT NULL CHECK (status IN ('running', 'completed', 'cancelled')),
    filter          jsonb       NOT NULL,
    reason          text        NOT NULL DEFAULT '',
    requested_by    text        NOT NULL DEFAULT '',
    reset_attempts  boolean     NOT NULL DEFAULT false,
    rate_per_second double precision NOT NULL CHECK (rate_per_second > 0),
    total           integer     NOT NULL DEFAULT 0,
    released        integer     NOT NULL DEFAULT 0,
    skipped         integer     NOT NULL DEFAULT 0,
    failed          integer     NOT NULL DEFAULT 0,
    runner          text        NOT NULL DEFAULT '',
    lease_until     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX job_operations_running_idx ON job_operations (lease_until) WHERE status = 'running';

-- state: pending, released (manual retry scheduled), skipped (the job was
-- no longer retryable, e.g. retried meanwhile), failed (the scheduler
-- refused with an error).
CREATE TABLE job_operation_items (
    operation_id text        NOT NULL REFERENCES job_operations (operation_id) ON DELETE CASCADE,
    job_id       text        NOT NULL,
    seq          integer     NOT NULL,
    state        text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'released', 'skipped', 'failed')),
    error        text        NOT NULL DEFAULT '',
    done_at      timestamptz,
    PRIMARY KEY (operation_id, job_id)
);
CREATE INDEX job_operation_items_pending_idx ON job_operation_items (operation_id, seq) WHERE state = 'pending';

-- +goose Down
DROP TABLE IF EXISTS job_operation_items;
DROP TABLE IF EXISTS job_operations;
DROP FUNCTION IF EXISTS retryd_normalize_error(text);
DROP INDEX IF EXISTS jobs_status_updated_idx;
DROP INDEX IF EXISTS jobs_created_idx;
ALTER TABLE jobs
    DROP CONSTRAINT IF EXISTS jobs_status_check,
    DROP COLUMN IF EXISTS checkpoint,
    DROP COLUMN IF EXISTS status_reason,
    DROP COLUMN IF EXISTS last_error_seq,
    DROP COLUMN IF EXISTS checkpoint_seq,
    DROP COLUMN IF EXISTS decision_seq,
    DROP COLUMN IF EXISTS state_seq;
