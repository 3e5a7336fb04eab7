-- +goose Up
-- The worker instance that ran the attempt, as its failed, held or
-- succeeded fact named it (field executor); '' when the owner did not
-- say (older workers, other owners) and on the scheduler's own rows.
-- A constant default adds the column without rewriting the table. No
-- CHECK on its length: the contract bounds it (64 bytes) before it gets
-- here, and adding a constraint would scan every history row.
ALTER TABLE retry_history ADD COLUMN executor text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE retry_history DROP COLUMN IF EXISTS executor;
