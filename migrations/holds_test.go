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

// 00111 gives items held now what the views show of their hold, from
// their last decision: its max_hold (a release's, which records none, the
// policy's), and the hold's end where one is known. Items not held, or
// whose last decision was not a hold, get neither.
func TestHoldViewMigrationFillsHeldItems(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 110)
	ctx := context.Background()

	heldSince := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	next := heldSince.Add(2 * time.Hour)
	_, err := b.conn.Exec(ctx, `INSERT INTO retries (kind, item_id, state, attempt, max_retries, policy_name, next_attempt_at, held_since, hold_reason, hold_key)
VALUES ('job', 'paused', 'scheduled', 2, 5, 'job-default', $2, $1, 'pause', 'shop'),
       ('job', 'throttled', 'scheduled', 2, 5, 'job-default', $2, $1, 'throttle', ''),
       ('job', 'looked-at', 'scheduled', 2, 5, 'job-default', $2, $1, 'concurrency', ''),
       ('event', 'released', 'scheduled', 2, 20, 'event-ingress', $2, $1, 'pause', 'shop'),
       ('job', 'manual', 'scheduled', 3, 5, 'job-default', $2, $1, 'pause', 'shop'),
       ('job', 'due', 'due', 2, 5, 'job-default', $2, $1, 'pause', 'shop'),
       ('job', 'failing', 'scheduled', 2, 5, 'job-default', $2, NULL, '', '')`, heldSince, next)
	require.NoError(t, err)
	_, err = b.conn.Exec(ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, decided_by, detail) VALUES
	('job', 'paused', 1, 'held', '', '{"reason":"pause","hold_key":"shop"}'),
	('job', 'paused', 2, 'scheduled', 'pause', '{"max_hold_ms":3600000}'),
	('job', 'throttled', 1, 'held', '', '{"reason":"throttle","until":"2030-01-01T00:00:00Z"}'),
	('job', 'throttled', 2, 'scheduled', 'hold', '{"max_hold_ms":7200000}'),
	('job', 'looked-at', 1, 'held', '', '{"reason":"concurrency"}'),
	('job', 'looked-at', 2, 'scheduled', 'hold', '{"max_hold_ms":7200000}'),
	('event', 'released', 1, 'held', '', '{"reason":"pause","hold_key":"shop"}'),
	('event', 'released', 2, 'scheduled', 'pause', '{"max_hold_ms":60000}'),
	('event', 'released', 2, 'rescheduled', 'resume', '{"hold_key":"shop"}'),
	('job', 'manual', 1, 'held', '', '{"reason":"pause"}'),
	('job', 'manual', 2, 'scheduled', 'pause', '{"max_hold_ms":3600000}'),
	('job', 'manual', 3, 'rescheduled', 'manual', '{}'),
	('job', 'failing', 1, 'failed', '', '{}'),
	('job', 'failing', 2, 'scheduled', 'backoff', '{}')`)
	require.NoError(t, err)
	b.up(t)
	b.requireAllApplied(t)

	type view struct {
		until   *time.Time
		maxHold *int64
	}
	get := func(kind, id string) view {
		var v view
		require.NoError(t, b.conn.QueryRow(ctx, `SELECT hold_until, max_hold_ms FROM retries WHERE kind = $1 AND item_id = $2`,
			kind, id).Scan(&v.until, &v.maxHold))
		return v
	}
	ms := func(v int64) *int64 { return &v }
	end := func(v view) time.Time {
		require.NotNil(t, v.until)
		return *v.until
	}
	require.Equal(t, view{nil, ms(3600000)}, get("job", "paused"), "a pause without an end")
	throttled := get("job", "throttled")
	require.Equal(t, ms(7200000), throttled.maxHold)
	require.True(t, next.Equal(end(throttled)), "the owner's until is the next attempt")
	require.Equal(t, view{nil, ms(7200000)}, get("job", "looked-at"), "looked at again, with no end known")
	released := get("event", "released")
	require.Equal(t, ms(30*24*time.Hour.Milliseconds()), released.maxHold, "a release records no max_hold: the policy's")
	require.True(t, next.Equal(end(released)), "released: the hold ends at its slot")
	require.Equal(t, view{}, get("job", "manual"), "retried by hand: not held")
	require.Equal(t, view{}, get("job", "due"), "due: its owner looks at it")
	require.Equal(t, view{}, get("job", "failing"))
}
