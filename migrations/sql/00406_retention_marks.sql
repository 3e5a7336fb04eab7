-- +goose Up
-- What each retention run of `retryd maintenance` removed before, per
-- table: rows older than cutoff (by the table's column; for an item
-- table, terminal rows whose terminal time is older) may be gone. The
-- retry analytics read it to say from when their figures are complete
-- (GET /v1/analytics/retries, complete_from). A later run with a longer
-- retention cannot bring deleted rows back, so cutoff only moves forward.
CREATE TABLE retention_marks (
    table_name text        PRIMARY KEY,
    cutoff     timestamptz NOT NULL,
    ran_at     timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS retention_marks;
