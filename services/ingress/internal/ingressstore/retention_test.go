package ingressstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
	"github.com/retryd/retryd/stores/retention"
)

// The gate stores an event id once, and `retryd maintenance` deletes
// admitted events only once the INGEST stream can no longer hold a message
// of theirs: an event admitted past INGEST's max age (its inbox claim long
// pruned) but within the retention still refuses its replayed message.
// Past the retention the id is new again, which is why the retention may
// not be shorter than INGEST's max age.
func TestReplayedEventWithinRetentionIsADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id = "ev-replayed"
	envelope := []byte(`{"id":"ev-replayed"}`)
	first, err := ingressstore.InsertEvent(b.ctx, b.pool, id, "shop", "order.paid", envelope, 1)
	require.NoError(t, err)
	require.True(t, first)
	admitted, err := ingressstore.SetEventStatus(b.ctx, b.pool, id, ingressstore.StatusAdmitted, ingressstore.StatusReceived)
	require.NoError(t, err)
	require.True(t, admitted)

	keep := func(daysAgo int) retention.TableReport {
		t.Helper()
		at := time.Now().Add(-time.Duration(daysAgo) * 24 * time.Hour)
		_, err := b.pool.Exec(b.ctx, `UPDATE workflow_events SET received_at = $2, admitted_at = $2, updated_at = $2 WHERE event_id = $1`, id, at)
		require.NoError(t, err)
		conn, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer conn.Release()
		rep, err := retention.Run(context.Background(), conn.Conn(), retention.Options{}, zerolog.Nop())
		require.NoError(t, err)
		for _, tr := range rep.Tables {
			if tr.Table == "workflow_events" {
				return tr
			}
		}
		require.FailNow(t, "no workflow_events in the report")
		return retention.TableReport{}
	}

	past := int(streams.DefaultMaxAge/(24*time.Hour)) + 3 // 10 days: INGEST no longer has it, the inbox claim is pruned
	require.Zero(t, keep(past).Deleted)
	again, err := ingressstore.InsertEvent(b.ctx, b.pool, id, "shop", "order.paid", envelope, 2)
	require.NoError(t, err)
	require.False(t, again, "a replayed event within the retention is a duplicate")
	ev, err := ingressstore.GetEvent(b.ctx, b.pool, id)
	require.NoError(t, err)
	require.Equal(t, ingressstore.StatusAdmitted, ev.Status)

	require.Equal(t, int64(1), keep(31).Deleted, "terminal for longer than the 30-day retention")
	anew, err := ingressstore.InsertEvent(b.ctx, b.pool, id, "shop", "order.paid", envelope, 3)
	require.NoError(t, err)
	require.True(t, anew, "past the retention the id is new: why the retention is at least INGEST's max age")
}
