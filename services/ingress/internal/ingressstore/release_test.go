package ingressstore_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// A release under a rate limit gives every deferred event a slot, in the
// order they were first deferred, from the first free slot of the current
// window; the pace it returns names the same slots; newcomers queue behind
// the line.
func TestPaceReleaseGivesHeldEventsSlotsInArrivalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := ingressstore.PauseSource(b.ctx, b.pool, "line", nil, "", "test")
	require.NoError(t, err)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	_, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "line", RateLimit: 4, RateWindow: time.Hour})
	require.NoError(t, err)
	// Deferred in the order d0..d9, though their ids sort the other way.
	var held []string
	for i := range 10 {
		id := "d" + string(rune('9'-i))
		b.insertEvent(t, id, "line")
		b.deferPaused(t, id, "line")
		held = append(held, id)
	}
	// One admission in the current window before the pause.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO event_source_windows (source, window_start, admitted)
		VALUES ('line', date_trunc('hour', now()), 1)`)
	require.NoError(t, err)

	pace, n := b.resumeAndPace(t, "line")
	require.NotNil(t, pace)
	require.EqualValues(t, len(held), n)
	require.NoError(t, pace.Validate())
	require.Equal(t, 4, pace.Limit)
	require.EqualValues(t, time.Hour.Milliseconds(), pace.WindowMS)

	rows, err := b.pool.Query(b.ctx, `SELECT event_id, slot_at FROM event_source_holds WHERE source = 'line' ORDER BY slot_at`)
	require.NoError(t, err)
	type hold struct {
		ID string
		At time.Time
	}
	holds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[hold])
	require.NoError(t, err)
	require.Len(t, holds, len(held))
	perWindow := map[time.Time]int{}
	for i, h := range holds {
		require.Equal(t, held[i], h.ID, "slot %d in arrival order", i)
		require.True(t, pace.SlotAt(i).Equal(h.At), "slot %d: store %s, pace %s", i, h.At, pace.SlotAt(i))
		perWindow[h.At.Truncate(time.Hour)]++
	}
	now := time.Now()
	require.False(t, holds[0].At.Before(now.Truncate(time.Hour)), "not before the current window")
	for w, c := range perWindow {
		if w.Equal(pace.From) {
			c += pace.Skip
		}
		require.LessOrEqual(t, c, 4, "window %s", w)
	}

	// A newcomer queues behind the line: its slot follows the last one.
	v := b.gate(t, "line", "invoice.paid")
	require.False(t, v.Admitted)
	require.True(t, v.RetryAt.After(holds[len(holds)-1].At), "newcomer at %s, line ends at %s", v.RetryAt, holds[len(holds)-1].At)

	// No limit: no pace; every deferred event is in the release line at
	// once, a microsecond apart, in arrival order.
	_, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "line"})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		pace, n, err = ingressstore.PaceRelease(b.ctx, tx, "line")
		return err
	}))
	require.Nil(t, pace)
	require.EqualValues(t, len(held), n)
	line := pgtest.Strings(t, b.pool, `SELECT event_id FROM event_source_holds WHERE source = 'line' AND released ORDER BY slot_at`)
	require.Equal(t, held, line)
}

// A limit changed while a pause with an until lasts paces the line from
// the pause's end, not from now, and the gate goes on from there.
func TestPaceReleaseDuringAPauseUntilStartsAtItsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	until := time.Now().Add(2 * time.Hour).UTC()
	_, err := ingressstore.PauseSource(b.ctx, b.pool, "later", &until, "", "test")
	require.NoError(t, err)
	_, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "later", RateLimit: 2, RateWindow: time.Minute})
	require.NoError(t, err)
	for _, id := range []string{"p0", "p1", "p2"} {
		b.insertEvent(t, id, "later")
		b.deferPaused(t, id, "later")
	}
	var pace *contract.ReleasePace
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		pace, _, err = ingressstore.PaceRelease(b.ctx, tx, "later")
		return err
	}))
	require.NotNil(t, pace, "paced from the pause's end")
	require.False(t, pace.SlotAt(0).Before(until), "first slot %s is not before the end %s", pace.SlotAt(0), until)
	require.Less(t, pace.SlotAt(0).Sub(until), time.Minute/2, "and at the first slot after it")

	// An event deferred now by the pause queues behind the three.
	b.insertEvent(t, "p3", "later")
	var v ingressstore.Verdict
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		v, err = ingressstore.Gate(b.ctx, tx, "later", "t", "p3")
		return err
	}))
	require.False(t, v.Admitted)
	require.Equal(t, ingressstore.ReasonSourcePaused, v.Reason)
	require.True(t, pace.SlotAt(3).Equal(v.RetryAt), "the fourth slot of the line: %s, gate %s", pace.SlotAt(3), v.RetryAt)
}
