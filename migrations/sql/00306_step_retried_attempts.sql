-- +goose Up
-- A node's retry count is made of writes that arrive in any order: its
-- failed report, the scheduler's decision for the run attempt and the
-- launch of the next one. Each of them counts the retry of an attempt it
-- finds failed, so the set of attempts already counted makes the count
-- exact: whichever comes first counts it, the others and a redelivered
-- report do not.
ALTER TABLE workflow_run_steps ADD COLUMN retried_run_attempts integer[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE workflow_run_steps DROP COLUMN IF EXISTS retried_run_attempts;
