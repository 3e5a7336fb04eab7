-- +goose Up
-- The INGEST stream sequence an event arrived with: the order a release
-- line follows. Arrival order by time is only approximate, because the
-- gate evaluates several events at once and their rows get timestamps
-- in the order the transactions run. Events stored before this column
-- existed have NULL and go first, since they arrived earlier.
ALTER TABLE workflow_events ADD COLUMN ingest_seq bigint;

-- A release adds up to a whole backlog of rows to event_source_holds at
-- once. With the statistics of the nearly empty table, the planner reads
-- and sorts the whole line for every batch the releaser takes, until
-- autovacuum analyzes it. Only the table's owner may ANALYZE it (on
-- PostgreSQL 15), and ingress runs as a role that does not own it: this
-- function analyzes the table with its owner's rights, and nothing else.
-- +goose StatementBegin
CREATE FUNCTION ingress_analyze_release_line() RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = public
    AS 'ANALYZE event_source_holds';
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS ingress_analyze_release_line();
ALTER TABLE workflow_events DROP COLUMN IF EXISTS ingest_seq;
