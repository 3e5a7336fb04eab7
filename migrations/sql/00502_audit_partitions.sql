-- +goose Up
-- audit_log grows with every operator action; retention drops whole
-- weekly partitions (projections/retention, run by `retryd maintenance`)
-- instead of deleting rows one by one, as 00109 did for retry_history.
-- Weeks, not days: operator actions are few, and a year's retention in
-- days would be 365 partitions of a few rows each. Weeks start on Monday,
-- UTC (date_trunc('week') here, time.Truncate in projections/retention).
-- The existing rows are kept in place: the old table becomes one
-- partition covering everything up to the end of this week (or of its
-- newest row's), so no row is rewritten. The primary key must hold the
-- partition key, so it becomes (id, at); id stays an identity and
-- continues from the old sequence. Nothing references audit_log and no
-- statement uses ON CONFLICT on it.
ALTER TABLE audit_log RENAME TO audit_log_legacy;
ALTER SEQUENCE audit_log_id_seq RENAME TO audit_log_legacy_id_seq;
ALTER INDEX audit_log_pkey RENAME TO audit_log_legacy_pkey;
-- Same definitions as the parent's indexes below: attaching the partition
-- adopts them instead of building new ones.
ALTER INDEX audit_log_at_idx RENAME TO audit_log_legacy_at_idx;
ALTER INDEX audit_log_principal_idx RENAME TO audit_log_legacy_principal_idx;
ALTER INDEX audit_log_action_idx RENAME TO audit_log_legacy_action_idx;

-- The same columns, defaults, checks and identity as the old table.
CREATE TABLE audit_log (
    LIKE audit_log_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_principal_idx ON audit_log (principal, id DESC);
CREATE INDEX audit_log_action_idx ON audit_log (action, id DESC);

SELECT setval('audit_log_id_seq', last_value, is_called) FROM audit_log_legacy_id_seq;
ALTER TABLE audit_log_legacy ALTER COLUMN id DROP IDENTITY;
ALTER TABLE audit_log_legacy DROP CONSTRAINT audit_log_legacy_pkey;

-- +goose StatementBegin
DO $$
DECLARE
    upper timestamptz;
    week  timestamptz;
BEGIN
    SELECT date_trunc('week', greatest(now(), coalesce(max(at), now())) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '7 days'
      INTO upper FROM audit_log_legacy;
    EXECUTE format('ALTER TABLE audit_log ATTACH PARTITION audit_log_legacy FOR VALUES FROM (MINVALUE) TO (%L)', upper);
    FOR i IN 0..1 LOOP
        week := upper + i * interval '7 days';
        EXECUTE format('CREATE TABLE %I PARTITION OF audit_log FOR VALUES FROM (%L) TO (%L)',
            'audit_log_p' || to_char(week AT TIME ZONE 'UTC', 'YYYYMMDD'), week, week + interval '7 days');
    END LOOP;
END
$$;
-- +goose StatementEnd
-- A row whose week has no partition (maintenance did not run) lands here
-- rather than failing the action; maintenance moves it into its week's
-- partition when it creates that partition, or deletes it once it is
-- older than the retention.
CREATE TABLE audit_log_default PARTITION OF audit_log DEFAULT;

-- +goose Down
-- Back to one plain table: the rows are copied.
ALTER TABLE audit_log RENAME TO audit_log_partitioned;
ALTER SEQUENCE audit_log_id_seq RENAME TO audit_log_partitioned_id_seq;
ALTER TABLE audit_log_partitioned DROP CONSTRAINT audit_log_pkey;
DROP INDEX audit_log_at_idx;
DROP INDEX audit_log_principal_idx;
DROP INDEX audit_log_action_idx;
CREATE TABLE audit_log (
    LIKE audit_log_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,
    PRIMARY KEY (id)
);
INSERT INTO audit_log OVERRIDING SYSTEM VALUE SELECT * FROM audit_log_partitioned;
SELECT setval('audit_log_id_seq', last_value, is_called) FROM audit_log_partitioned_id_seq;
DROP TABLE audit_log_partitioned;
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_principal_idx ON audit_log (principal, id DESC);
CREATE INDEX audit_log_action_idx ON audit_log (action, id DESC);
