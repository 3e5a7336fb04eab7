package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
)

// 00302 gives triggers its own copy of the events of deliveries it holds:
// deliveries held at upgrade time get theirs from ingress's table, once;
// the events of launched deliveries are not copied.
func TestTriggerEventsMigrationCopiesHeldDeliveriesEvents(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 301)
	ctx := context.Background()

	for _, id := range []string{"e-held", "e-done"} {
		_, err := b.conn.Exec(ctx, `INSERT INTO workflow_events (event_id, source, type, status, envelope)
VALUES ($1, 'crm', 'lead.created', 'admitted', $2)`, id, `{"id":"`+id+`"}`)
		require.NoError(t, err)
	}
	_, err := b.conn.Exec(ctx, `INSERT INTO workflow_trigger_deliveries (delivery_id, trigger_id, trigger_version, event_id, source, event_type, status)
VALUES ('d-held', 't1', 1, 'e-held', 'crm', 'lead.created', 'concurrency_limited'),
       ('d-done', 't1', 1, 'e-done', 'crm', 'lead.created', 'launched')`)
	require.NoError(t, err)
	b.up(t)
	b.requireAllApplied(t)

	ids := pgtest.Strings(t, b.conn, `SELECT event_id || '=' || envelope::text FROM trigger_events ORDER BY event_id`)
	require.Equal(t, []string{`e-held={"id":"e-held"}`}, ids)
}
