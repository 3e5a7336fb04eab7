package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Items that owners held back before holds existed were recorded as
// failures and used a retry per hold. 00102 gives pending ones their
// budget back and makes them holds; other rows are left as they were.
func TestHoldsMigrationRefundsLegacyHolds(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 101)
	ctx := context.Background()

	failedAt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err := b.conn.Exec(ctx, `INSERT INTO retries (kind, item_id, state, attempt, retry_count, max_retries, source, last_reason, last_error_at, next_attempt_at)
VALUES ('event', 'paused', 'scheduled', 15, 14, 20, 'shop', 'source_paused', $1, $1),
       ('event', 'throttled', 'due', 4, 3, 20, 'shop', 'source_throttled', $1, $1),
       ('event-trigger', 'slot', 'scheduled', 3, 2, 20, '', 'max_concurrency', $1, $1),
       ('job', 'failing', 'scheduled', 3, 2, 5, '', '', $1, $1),
       ('event', 'done', 'exhausted', 21, 20, 20, 'shop', 'source_paused', $1, NULL)`, failedAt)
	require.NoError(t, err)
	b.up(t)
	b.requireAllApplied(t)

	type row struct {
		retryCount, budgetBase int
		heldSince              *time.Time
		reason, key            string
	}
	get := func(kind, id string) row {
		var r row
		require.NoError(t, b.conn.QueryRow(ctx, `SELECT retry_count, budget_base, held_since, hold_reason, hold_key
FROM retries WHERE kind = $1 AND item_id = $2`, kind, id).Scan(&r.retryCount, &r.budgetBase, &r.heldSince, &r.reason, &r.key))
		return r
	}
	paused := get("event", "paused")
	require.Equal(t, row{0, 14, paused.heldSince, "pause", "shop"}, paused)
	require.True(t, failedAt.Equal(*paused.heldSince))
	throttled := get("event", "throttled")
	require.Equal(t, row{0, 3, throttled.heldSince, "throttle", ""}, throttled)
	slot := get("event-trigger", "slot")
	require.Equal(t, row{0, 2, slot.heldSince, "concurrency", ""}, slot)
	require.Equal(t, row{2, 0, nil, "", ""}, get("job", "failing"))
	require.Equal(t, row{20, 0, nil, "", ""}, get("event", "done"))

	var maxHold, maxRetryAfter int64
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT max_hold_ms, max_retry_after_ms FROM retry_policies WHERE kind = 'event' AND job_type = ''`).Scan(&maxHold, &maxRetryAfter))
	require.Equal(t, int64(30*24*time.Hour/time.Millisecond), maxHold)
	require.Equal(t, int64(24*time.Hour/time.Millisecond), maxRetryAfter)
}
