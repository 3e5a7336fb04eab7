-- +goose Up
-- Max concurrency as leases. A trigger may set its own run timeout
-- (run_timeout_ms; NULL means the service's RETRYD_TRIGGERS_RUN_TIMEOUT),
-- and a run holds its slot until lease_expires_at, which executors push
-- forward with heartbeats. Runs launched before this migration keep a NULL
-- lease: the reconcile pass reads it as requested_at plus the service
-- default, as it did before, so no row needs rewriting.
ALTER TABLE workflow_triggers
    ADD COLUMN run_timeout_ms bigint
        CHECK (run_timeout_ms IS NULL OR (run_timeout_ms >= 1000 AND run_timeout_ms <= 604800000));

ALTER TABLE workflow_runs
    ADD COLUMN lease_expires_at timestamptz;

-- The reconcile pass: runs in flight whose lease ended.
CREATE INDEX workflow_runs_lease_idx
    ON workflow_runs (lease_expires_at)
    WHERE status IN ('requested', 'running');

-- +goose Down
DROP INDEX IF EXISTS workflow_runs_lease_idx;
ALTER TABLE workflow_runs DROP COLUMN IF EXISTS lease_expires_at;
ALTER TABLE workflow_triggers DROP COLUMN IF EXISTS run_timeout_ms;
