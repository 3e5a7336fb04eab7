package ingressstore_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// lateLine is a source with room in its window and three holders in line
// whose events are deferred, the first two late: their slots passed a
// second ago and their dues have not come. The last one's slot is now.
type lateLine struct {
	*bundle
	first, second, last string
}

func setupLateLine(t *testing.T) *lateLine {
	t.Helper()
	b := setup(t)
	b.putSource(t, ingressstore.SourceConfig{Source: "tardy", RateLimit: 5, RateWindow: day})
	for range 5 {
		require.True(t, b.gate(t, "tardy", "invoice.paid").Admitted)
	}
	l := &lateLine{bundle: b}
	for _, id := range []*string{&l.first, &l.second, &l.last} {
		var v ingressstore.Verdict
		*id, v = b.gateID(t, "tardy", "invoice.paid")
		require.False(t, v.Admitted)
		b.insertEvent(t, *id, "tardy")
		_, err := ingressstore.SetEventStatus(b.ctx, b.pool, *id, ingressstore.StatusDeferred)
		require.NoError(t, err)
		require.NoError(t, ingressstore.RecordDeferral(b.ctx, b.pool, ingressstore.Deferral{
			EventID: *id, Source: "tardy", Attempt: 1, Reason: ingressstore.ReasonSourceThrottled, Class: "rate_limit",
		}))
		_, err = ingressstore.ConfirmScheduled(b.ctx, b.pool, *id, 2, time.Now(), map[string]any{"decided_by": "throttle"})
		require.NoError(t, err)
	}
	for id, ago := range map[string]string{l.first: "1 second", l.second: "900 milliseconds", l.last: "0"} {
		_, err := b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = now() - $2::interval WHERE event_id = $1`, id, ago)
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(b.ctx, `DELETE FROM event_source_windows`)
	require.NoError(t, err)
	return l
}

func (l *lateLine) status(t *testing.T, id string) ingressstore.Status {
	t.Helper()
	ev, err := ingressstore.GetEvent(l.ctx, l.pool, id)
	require.NoError(t, err)
	return ev.Status
}

func (l *lateLine) holds(t *testing.T) int {
	t.Helper()
	return pgtest.Count(t, l.pool, `SELECT count(*) FROM event_source_holds`)
}

// Holders whose slots passed more than turnLate ago without their dues are
// not passed by the holder behind them: its due admits them first, in
// line order, in its own transaction, and counts them in the window.
func TestGateLateHoldersAreAdmittedAheadOfTheHolderBehind(t *testing.T) {
	t.Parallel()
	l := setupLateLine(t)

	v := l.gateDue(t, "tardy", l.last)
	require.True(t, v.Admitted)
	require.Len(t, v.Before, 2, "both late holders ahead")
	for i, id := range []string{l.first, l.second} {
		got := v.Before[i]
		require.Equal(t, id, got.ID, "in line order")
		require.Equal(t, "tardy", got.Source)
		require.Equal(t, ingressstore.StatusAdmitted, got.Status)
		require.Equal(t, 2, got.Attempt, "the attempt their dues carry")
		require.JSONEq(t, `{"id":"`+id+`"}`, string(got.Envelope))
		require.True(t, v.Now.Equal(*got.AdmittedAt), "admitted at the decision's time")
		require.Equal(t, ingressstore.StatusAdmitted, l.status(t, id))
		r, err := ingressstore.GetRetry(l.ctx, l.pool, id)
		require.NoError(t, err)
		require.Equal(t, ingressstore.RetryCompleted, r.State)
	}
	require.Zero(t, l.holds(t), "the late holders left the line")
	var admitted int
	require.NoError(t, l.pool.QueryRow(l.ctx, `SELECT admitted FROM event_source_windows`).Scan(&admitted))
	require.Equal(t, 3, admitted, "the late holders count in the window with the holder")
}

// The late holders' admission is part of the holder's decision: when its
// count loses the window's last room (ErrWindowFilled) and the caller rolls
// back, they are still deferred, in line.
func TestGateLateHoldersRollBackWithTheHolder(t *testing.T) {
	t.Parallel()
	l := setupLateLine(t)

	err := pgx.BeginFunc(l.ctx, l.pool, func(tx pgx.Tx) error {
		v, err := ingressstore.GateDue(l.ctx, tx, "tardy", "invoice.paid", l.last)
		require.NoError(t, err)
		require.Len(t, v.Before, 2)
		// Another instance fills the window meanwhile.
		_, err = tx.Exec(l.ctx, `
			INSERT INTO event_source_windows (source, window_start, admitted)
			SELECT 'tardy', to_timestamp(floor(extract(epoch FROM now()) / 86400) * 86400 + k * 86400), 5 FROM generate_series(-1, 1) k
			ON CONFLICT (source, window_start) DO UPDATE SET admitted = EXCLUDED.admitted`)
		require.NoError(t, err)
		return ingressstore.CountAdmission(l.ctx, tx, v)
	})
	require.ErrorIs(t, err, ingressstore.ErrWindowFilled)
	require.Equal(t, ingressstore.StatusDeferred, l.status(t, l.first))
	require.Equal(t, 3, l.holds(t), "every holder still in line")
}

// A late holder whose event another transaction holds (its due deciding
// it right now) is not waited for, and one whose type the source no longer
// allows is left for its due, which cancels it: the holder behind is
// admitted with the others.
func TestGateLateHoldersLockedOrNotAllowedAreLeft(t *testing.T) {
	t.Parallel()
	l := setupLateLine(t)
	_, err := l.pool.Exec(l.ctx, `UPDATE workflow_events SET type = 'order.created' WHERE event_id = $1`, l.second)
	require.NoError(t, err)
	_, err = l.pool.Exec(l.ctx, `UPDATE event_sources SET allowed_types = ARRAY['invoice.paid'] WHERE source = 'tardy'`)
	require.NoError(t, err)

	other, err := l.pool.Begin(l.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Rollback(l.ctx) })
	_, err = ingressstore.LockEvent(l.ctx, other, l.first)
	require.NoError(t, err)

	v := l.gateDue(t, "tardy", l.last)
	require.True(t, v.Admitted)
	require.Empty(t, v.Before)
	require.NoError(t, other.Rollback(l.ctx))
	require.Equal(t, ingressstore.StatusDeferred, l.status(t, l.first))
	require.Equal(t, ingressstore.StatusDeferred, l.status(t, l.second))
	require.Equal(t, 2, l.holds(t))
}
