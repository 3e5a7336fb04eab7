-- +goose Up
-- Workflow runs retry (docs/runs.md). A run moves through seed 003's
-- statuses: requested (launched, no node reported yet), in_progress,
-- retrying (failed; the scheduler brings it back from its checkpoint),
-- then completed, failed (not retryable) or failed_max_retries. "running"
-- was never written; a row that has it reads as in_progress.
UPDATE workflow_runs SET status = 'in_progress' WHERE status = 'running';
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_status_check;
ALTER TABLE workflow_runs
    ADD CONSTRAINT workflow_runs_status_check
        CHECK (status IN ('requested', 'in_progress', 'retrying', 'completed', 'failed', 'failed_max_retries')),
    ADD COLUMN attempt              integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    ADD COLUMN retry_count          integer     NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    ADD COLUMN max_retries          integer,
    ADD COLUMN retry_enabled        boolean     NOT NULL DEFAULT true,
    ADD COLUMN current_node_id      text        NOT NULL DEFAULT '',
    ADD COLUMN last_error_class     text        NOT NULL DEFAULT '',
    ADD COLUMN last_error_message   text        NOT NULL DEFAULT '',
    ADD COLUMN last_error_timestamp timestamptz,
    ADD COLUMN next_retry_at        timestamptz,
    ADD COLUMN executor             text        NOT NULL DEFAULT '';

-- A run holds its trigger's concurrency slot until it ends for good: a
-- retrying run keeps it, so its retry never waits behind a newer run and
-- the trigger never has more runs in flight than its max concurrency.
DROP INDEX IF EXISTS workflow_runs_inflight_idx;
CREATE INDEX workflow_runs_inflight_idx ON workflow_runs (trigger_id)
    WHERE status IN ('requested', 'in_progress', 'retrying');
DROP INDEX IF EXISTS workflow_runs_lease_idx;
CREATE INDEX workflow_runs_lease_idx ON workflow_runs (lease_expires_at)
    WHERE status IN ('requested', 'in_progress');
CREATE INDEX workflow_runs_retrying_idx ON workflow_runs (next_retry_at) WHERE status = 'retrying';
-- Operator views: runs newest first, all or by status or workflow.
CREATE INDEX workflow_runs_list_idx ON workflow_runs (requested_at DESC, run_id DESC);
CREATE INDEX workflow_runs_status_idx ON workflow_runs (status, requested_at DESC, run_id DESC);

-- A node of a run, as its executor reported it. status: completed or
-- failed (its last report); reported_at: when the executor first reported
-- it (its message's time), which orders a run's nodes, since reports are
-- applied concurrently; attempts: how many attempts of the run ran it;
-- retry_state: none, scheduled (the run comes back at next_attempt_at and
-- starts at this node), exhausted (it will not), succeeded (completed
-- after failing). output is what a retry resumes with.
UPDATE workflow_run_steps SET status = 'failed' WHERE status NOT IN ('completed', 'failed');
ALTER TABLE workflow_run_steps
    ALTER COLUMN status SET DEFAULT 'completed',
    ADD CONSTRAINT workflow_run_steps_status_check CHECK (status IN ('completed', 'failed')),
    ADD CONSTRAINT workflow_run_steps_retry_state_check
        CHECK (retry_state IN ('none', 'scheduled', 'exhausted', 'succeeded')),
    ADD COLUMN reported_at        timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN attempts           integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    ADD COLUMN run_attempt        integer     NOT NULL DEFAULT 1,
    ADD COLUMN output             jsonb,
    ADD COLUMN last_error_class   text        NOT NULL DEFAULT '',
    ADD COLUMN last_error_message text        NOT NULL DEFAULT '',
    ADD COLUMN executor           text        NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE workflow_run_steps
    DROP CONSTRAINT IF EXISTS workflow_run_steps_status_check,
    DROP CONSTRAINT IF EXISTS workflow_run_steps_retry_state_check,
    DROP COLUMN IF EXISTS reported_at,
    DROP COLUMN IF EXISTS attempts,
    DROP COLUMN IF EXISTS run_attempt,
    DROP COLUMN IF EXISTS output,
    DROP COLUMN IF EXISTS last_error_class,
    DROP COLUMN IF EXISTS last_error_message,
    DROP COLUMN IF EXISTS executor;
ALTER TABLE workflow_run_steps ALTER COLUMN status SET DEFAULT 'in_progress';
DROP INDEX IF EXISTS workflow_runs_status_idx;
DROP INDEX IF EXISTS workflow_runs_list_idx;
DROP INDEX IF EXISTS workflow_runs_retrying_idx;
DROP INDEX IF EXISTS workflow_runs_lease_idx;
CREATE INDEX workflow_runs_lease_idx ON workflow_runs (lease_expires_at) WHERE status IN ('requested', 'running');
DROP INDEX IF EXISTS workflow_runs_inflight_idx;
CREATE INDEX workflow_runs_inflight_idx ON workflow_runs (trigger_id) WHERE status IN ('requested', 'running');
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_status_check;
UPDATE workflow_runs SET status = 'failed' WHERE status IN ('retrying', 'failed_max_retries');
UPDATE workflow_runs SET status = 'running' WHERE status = 'in_progress';
ALTER TABLE workflow_runs
    ADD CONSTRAINT workflow_runs_status_check CHECK (status IN ('requested', 'running', 'completed', 'failed')),
    DROP COLUMN IF EXISTS attempt,
    DROP COLUMN IF EXISTS retry_count,
    DROP COLUMN IF EXISTS max_retries,
    DROP COLUMN IF EXISTS retry_enabled,
    DROP COLUMN IF EXISTS current_node_id,
    DROP COLUMN IF EXISTS last_error_class,
    DROP COLUMN IF EXISTS last_error_message,
    DROP COLUMN IF EXISTS last_error_timestamp,
    DROP COLUMN IF EXISTS next_retry_at,
    DROP COLUMN IF EXISTS executor;
