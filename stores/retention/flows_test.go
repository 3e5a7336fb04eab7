package retention_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/stores/retention"
)

// The item tables of ingress and triggers: terminal rows older than the
// retention go with their child rows, held and in-flight ones stay
// however old, and so do the young terminal ones, which still refuse a
// replayed message of their id.
func TestRetentionDeletesTerminalEventsDeliveriesAndRuns(t *testing.T) {
	t.Parallel()
	ctx, conn, _, ago := itemDB(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}

	event := func(id, status string, at time.Time, retryState string) {
		t.Helper()
		exec(`INSERT INTO workflow_events (event_id, source, type, status, envelope, received_at, updated_at)
VALUES ($1, 'shop', 'order.paid', $2, '{}', $3, $3)`, id, status, at)
		if retryState != "" {
			exec(`INSERT INTO event_ingress_retries (event_id, source, retry_state, created_at, updated_at)
VALUES ($1, 'shop', $2, $3, $3)`, id, retryState, at)
		}
	}
	event("ev-old-admitted", "admitted", ago(40), "")
	event("ev-old-exhausted", "exhausted", ago(40), "exhausted")
	event("ev-old-cancelled", "cancelled", ago(31), "cancelled")
	event("ev-old-deferred", "deferred", ago(60), "scheduled") // held: kept however old
	event("ev-young-admitted", "admitted", ago(10), "")        // older than INGEST's 7 days, within the retention

	insertRun := func(id, status string, at time.Time) {
		t.Helper()
		exec(`INSERT INTO workflow_runs (run_id, workflow, delivery_id, trigger_id, event_id, status, requested_at, updated_at)
VALUES ($1, 'ship', $1, 't1', $1, $2, $3, $3)`, id, status, at)
		exec(`INSERT INTO workflow_run_steps (run_id, step_id, status) VALUES ($1, 'pack', 'completed')`, id)
	}
	insertRun("run-old-completed", "completed", ago(40))
	insertRun("run-old-failed", "failed_max_retries", ago(35))
	insertRun("run-old-retrying", "retrying", ago(40)) // in flight: kept
	insertRun("run-young", "completed", ago(3))

	delivery := func(id, status string, runID *string, at time.Time) {
		t.Helper()
		exec(`INSERT INTO workflow_trigger_deliveries (delivery_id, trigger_id, trigger_version, event_id, source, event_type,
	status, run_id, created_at, updated_at)
VALUES ($1, 't1', 1, $1, 'shop', 'order.paid', $2, $3, $4, $4)`, id, status, runID, at)
	}
	delivery("d-old-launched", "launched", new("run-old-completed"), ago(40))
	delivery("d-old-launched-inflight", "launched", new("run-old-retrying"), ago(40)) // its run is in flight
	delivery("d-old-filtered", "filtered", nil, ago(40))
	delivery("d-old-exhausted", "exhausted", nil, ago(45))
	delivery("d-old-throttled", "throttled", nil, ago(45)) // held: kept
	delivery("d-young-filtered", "filtered", nil, ago(10))

	opts := defaults
	opts.DryRun = true
	dry := run(t, conn, opts)
	require.Equal(t, int64(3), of(t, dry, "workflow_events").Deleted)
	require.Equal(t, int64(3), of(t, dry, "workflow_trigger_deliveries").Deleted)
	require.Equal(t, int64(2), of(t, dry, "workflow_runs").Deleted)
	require.Equal(t, int64(5), countRows(t, conn, "workflow_events"), "a dry run deletes nothing")

	opts.DryRun = false
	opts.Batch = 2
	rep := run(t, conn, opts)
	for table, n := range map[string]int64{"workflow_events": 3, "workflow_trigger_deliveries": 3, "workflow_runs": 2} {
		tr := of(t, rep, table)
		require.Equal(t, retention.MethodRows, tr.Method, table)
		require.Equal(t, "30d", tr.Retention, table)
		require.Equal(t, n, tr.Deleted, table)
	}
	require.Equal(t, []string{"ev-old-deferred", "ev-young-admitted"}, ids(t, conn, `SELECT event_id FROM workflow_events ORDER BY 1`))
	require.Equal(t, []string{"ev-old-deferred"}, ids(t, conn, `SELECT event_id FROM event_ingress_retries ORDER BY 1`),
		"the deleted events' retries went with them")
	require.Equal(t, []string{"d-old-launched-inflight", "d-old-throttled", "d-young-filtered"},
		ids(t, conn, `SELECT delivery_id FROM workflow_trigger_deliveries ORDER BY 1`))
	require.Equal(t, []string{"run-old-retrying", "run-young"}, ids(t, conn, `SELECT run_id FROM workflow_runs ORDER BY 1`))
	require.Equal(t, []string{"run-old-retrying", "run-young"}, ids(t, conn, `SELECT DISTINCT run_id FROM workflow_run_steps ORDER BY 1`),
		"the deleted runs' steps went with them")

	// A replay of a kept event's INGEST message, 10 days on (past
	// INGEST's 7 days, so its inbox claim is long pruned), meets the row
	// and is not stored again: the gate's InsertEvent, word for word.
	tag, err := conn.Exec(ctx, `INSERT INTO workflow_events (event_id, source, type, status, envelope, ingest_seq)
		VALUES ($1, $2, $3, 'received', $4, $5)
		ON CONFLICT (event_id) DO NOTHING`, "ev-young-admitted", "shop", "order.paid", "{}", nil)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a replayed event within the retention is a duplicate")
	// And a kept delivery's EVENTS message: its (event, trigger) key.
	_, err = conn.Exec(ctx, `INSERT INTO workflow_trigger_deliveries (delivery_id, trigger_id, trigger_version, event_id, source, event_type, status)
VALUES ('d-again', 't1', 1, 'd-young-filtered', 'shop', 'order.paid', 'launched')`)
	require.ErrorContains(t, err, "workflow_trigger_deliveries_event_id_trigger_id_key")

	again := run(t, conn, opts)
	for _, table := range []string{"workflow_events", "workflow_trigger_deliveries", "workflow_runs"} {
		require.Zero(t, of(t, again, table).Deleted, "a second run has nothing to do: %s", table)
	}
	// The run in flight ends (its updated_at left old, to see both go):
	// its delivery goes with the next run, and so does the run.
	exec(`UPDATE workflow_runs SET status = 'completed' WHERE run_id = 'run-old-retrying'`)
	last := run(t, conn, opts)
	require.Equal(t, int64(1), of(t, last, "workflow_trigger_deliveries").Deleted)
	require.Equal(t, int64(1), of(t, last, "workflow_runs").Deleted)
}
