-- +goose Up
-- retry_history grows with every attempt; retention drops whole daily
-- partitions (projections/retention, run by `retryd maintenance`) instead
-- of deleting rows one by one. The existing rows are kept in place: the
-- old table becomes one partition covering everything up to tomorrow (or
-- past its newest row), so no row is rewritten; attaching it scans it
-- once to check the bound. The primary key must hold the partition key,
-- so it becomes (id, at); id stays an identity and continues from the old
-- sequence.
ALTER TABLE retry_history RENAME TO retry_history_legacy;
ALTER SEQUENCE retry_history_id_seq RENAME TO retry_history_legacy_id_seq;
ALTER INDEX retry_history_pkey RENAME TO retry_history_legacy_pkey;
-- Same definitions as the parent's indexes below: attaching the partition
-- adopts them instead of building new ones.
ALTER INDEX retry_history_item_idx RENAME TO retry_history_legacy_item_idx;
ALTER INDEX retry_history_job_failures_idx RENAME TO retry_history_legacy_job_failures_idx;

-- The same columns, defaults and identity as the old table (LIKE copies
-- them in order); the identity gets a sequence of its own, set below.
CREATE TABLE retry_history (
    LIKE retry_history_legacy INCLUDING DEFAULTS INCLUDING IDENTITY,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE INDEX retry_history_item_idx ON retry_history (kind, item_id, id);
CREATE INDEX retry_history_job_failures_idx ON retry_history (at)
    WHERE kind = 'job' AND event = 'failed' AND job_type <> '';

SELECT setval('retry_history_id_seq', last_value, is_called) FROM retry_history_legacy_id_seq;
ALTER TABLE retry_history_legacy ALTER COLUMN id DROP IDENTITY;
ALTER TABLE retry_history_legacy DROP CONSTRAINT retry_history_legacy_pkey;

-- +goose StatementBegin
DO $$
DECLARE
    upper timestamptz;
    day   timestamptz;
BEGIN
    -- Partitions are UTC days (projections/retention names and creates
    -- them the same way).
    SELECT date_trunc('day', greatest(now(), coalesce(max(at), now())) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '24 hours'
      INTO upper FROM retry_history_legacy;
    EXECUTE format('ALTER TABLE retry_history ATTACH PARTITION retry_history_legacy FOR VALUES FROM (MINVALUE) TO (%L)', upper);
    FOR i IN 0..6 LOOP
        day := upper + i * interval '24 hours';
        EXECUTE format('CREATE TABLE %I PARTITION OF retry_history FOR VALUES FROM (%L) TO (%L)',
            'retry_history_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD'), day, day + interval '24 hours');
    END LOOP;
END
$$;
-- +goose StatementEnd
-- A row whose day has no partition (maintenance did not run) lands here
-- rather than failing the insert; maintenance moves it into its day's
-- partition when it creates that partition, or deletes it once it is
-- older than the retention.
CREATE TABLE retry_history_default PARTITION OF retry_history DEFAULT;

-- +goose Down
-- Back to one plain table: the rows are copied (a partitioned table cannot
-- become a plain one in place).
ALTER TABLE retry_history RENAME TO retry_history_partitioned;
ALTER SEQUENCE retry_history_id_seq RENAME TO retry_history_partitioned_id_seq;
ALTER TABLE retry_history_partitioned DROP CONSTRAINT retry_history_pkey;
DROP INDEX retry_history_item_idx;
DROP INDEX retry_history_job_failures_idx;
CREATE TABLE retry_history (
    LIKE retry_history_partitioned INCLUDING DEFAULTS INCLUDING IDENTITY,
    PRIMARY KEY (id)
);
INSERT INTO retry_history OVERRIDING SYSTEM VALUE SELECT * FROM retry_history_partitioned;
SELECT setval('retry_history_id_seq', last_value, is_called) FROM retry_history_partitioned_id_seq;
DROP TABLE retry_history_partitioned;
CREATE INDEX retry_history_item_idx ON retry_history (kind, item_id, id);
CREATE INDEX retry_history_job_failures_idx ON retry_history (at)
    WHERE kind = 'job' AND event = 'failed' AND job_type <> '';
