-- +goose Up
-- Workflow runs retry (kind "run", docs/runs.md) on seed 003's defaults:
-- 3 retries, a 1 s base, x2, a 5 min cap and up to 1 s of jitter, with the
-- classes that need a person to fix them not retried.
INSERT INTO retry_policies (kind, job_type, name, max_retries, base_delay_ms, multiplier, max_delay_ms, jitter, jitter_ms, non_retryable_classes)
VALUES ('run', '', 'workflow_run', 3, 1000, 2, 300000, 'additive', 1000, '{authentication,permission,validation}')
ON CONFLICT DO NOTHING;

INSERT INTO retry_policy_versions (kind, job_type, version, policy, changed_by)
SELECT kind, job_type, version, to_jsonb(p) - 'created_at' - 'updated_at', 'migration'
FROM retry_policies p WHERE kind = 'run' AND job_type = '' AND version = 1
ON CONFLICT DO NOTHING;

-- +goose Down
DELETE FROM retry_policy_versions WHERE kind = 'run' AND job_type = '' AND changed_by = 'migration';
DELETE FROM retry_policies WHERE kind = 'run' AND job_type = '' AND name = 'workflow_run';
