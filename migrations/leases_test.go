package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// 00301 adds per-trigger run timeouts and run leases. Rows written before
// it migrate as they are: NULL is the service's default timeout and, for a
// run, a lease of requested_at plus that default. Out-of-range timeouts
// are refused by the database too.
func TestRunLeasesMigrationKeepsExistingRows(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 300)
	ctx := context.Background()

	_, err := b.conn.Exec(ctx, `INSERT INTO workflow_triggers (trigger_id, name, source, event_type, workflow, max_concurrency)
VALUES ('t1', 'n', 'crm', 'lead.created', 'enrich', 1)`)
	require.NoError(t, err)
	_, err = b.conn.Exec(ctx, `INSERT INTO workflow_runs (run_id, workflow, delivery_id, trigger_id) VALUES ('r1', 'enrich', 'd1', 't1')`)
	require.NoError(t, err)
	b.up(t)
	b.requireAllApplied(t)

	var timeout *int64
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT run_timeout_ms FROM workflow_triggers WHERE trigger_id = 't1'`).Scan(&timeout))
	require.Nil(t, timeout)
	var lease *string
	var status string
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT lease_expires_at::text, status FROM workflow_runs WHERE run_id = 'r1'`).Scan(&lease, &status))
	require.Nil(t, lease)
	require.Equal(t, "requested", status)

	for _, ms := range []int64{0, 999, 604800001} {
		_, err := b.conn.Exec(ctx, `UPDATE workflow_triggers SET run_timeout_ms = $1 WHERE trigger_id = 't1'`, ms)
		require.ErrorContains(t, err, "check constraint", "%d ms", ms)
	}
	_, err = b.conn.Exec(ctx, `UPDATE workflow_triggers SET run_timeout_ms = 1000 WHERE trigger_id = 't1'`)
	require.NoError(t, err)
}
