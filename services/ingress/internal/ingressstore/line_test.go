package ingressstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// deferPaused marks event id deferred by its source's pause, as the gate
// does: status deferred and a first deferral for the pause.
func (b *bundle) deferPaused(t *testing.T, id, source string) {
	t.Helper()
	_, err := ingressstore.SetEventStatus(b.ctx, b.pool, id, ingressstore.StatusDeferred)
	require.NoError(t, err)
	require.NoError(t, ingressstore.RecordDeferral(b.ctx, b.pool, ingressstore.Deferral{
		EventID: id, Source: source, Attempt: 1, Reason: ingressstore.ReasonSourcePaused}))
}

// resumeAndPace resumes source and paces the release of its held events
// in one transaction, as the resume API does; it returns the pace and
// how many events it lined up.
func (b *bundle) resumeAndPace(t *testing.T, source string) (*contract.ReleasePace, int64) {
	t.Helper()
	var pace *contract.ReleasePace
	var n int64
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := ingressstore.ResumeSource(b.ctx, tx, source, "test"); err != nil {
			return err
		}
		var err error
		pace, n, err = ingressstore.PaceRelease(b.ctx, tx, source)
		return err
	}))
	return pace, n
}

// holdLine defers n events of source (paused) in the order l0, l1, ...,
// resumes it and lines them up, and returns their ids in arrival order.
func (b *bundle) holdLine(t *testing.T, source string, n int) []string {
	t.Helper()
	_, err := ingressstore.PauseSource(b.ctx, b.pool, source, nil, "", "test")
	require.NoError(t, err)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%04d", source, n-i) // ids sort against arrival
		b.insertEvent(t, id, source)
		b.deferPaused(t, id, source)
		ids = append(ids, id)
	}
	_, lined := b.resumeAndPace(t, source)
	require.EqualValues(t, n, lined)
	return ids
}

func (b *bundle) admitReleased(t *testing.T, limit int) []ingressstore.Released {
	t.Helper()
	var out []ingressstore.Released
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		out, err = ingressstore.AdmitReleased(b.ctx, tx, limit)
		return err
	}))
	return out
}

func releasedIDs(rs []ingressstore.Released) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// The line is admitted in arrival order, a batch at a time; each event
// once, with the attempt its due would have carried, and the line empties.
func TestAdmitReleasedInArrivalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.holdLine(t, "open", 25)

	first := b.admitReleased(t, 10)
	require.Equal(t, ids[:10], releasedIDs(first))
	for _, r := range first {
		require.Equal(t, ingressstore.StatusAdmitted, r.Status)
		require.Equal(t, 2, r.Attempt, "the first deferral was attempt 1")
		require.JSONEq(t, `{"id":"`+r.ID+`"}`, string(r.Envelope))
	}
	rest := b.admitReleased(t, 100)
	require.Equal(t, ids[10:], releasedIDs(rest))
	require.Empty(t, b.admitReleased(t, 100), "each event once")

	var admitted, lined, completed int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM workflow_events WHERE source = 'open' AND status = 'admitted'),
		(SELECT count(*) FROM event_source_holds WHERE source = 'open'),
		(SELECT count(*) FROM event_ingress_retries WHERE source = 'open' AND retry_state = 'completed' AND attempts = 2)`).
		Scan(&admitted, &lined, &completed))
	require.Equal(t, 25, admitted)
	require.Zero(t, lined)
	require.Equal(t, 25, completed)
	_, ok, err := ingressstore.NextReleaseSlot(b.ctx, b.pool)
	require.NoError(t, err)
	require.False(t, ok, "no line left")
}

// Two admitters at once (two ingress instances) share the line: every
// event is admitted by exactly one of them.
func TestAdmitReleasedConcurrentlyAdmitsEachOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.holdLine(t, "shared", 200)

	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				var got []ingressstore.Released
				err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
					var err error
					got, err = ingressstore.AdmitReleased(b.ctx, tx, 7)
					return err
				})
				if err != nil || len(got) == 0 {
					return
				}
				mu.Lock()
				for _, r := range got {
					seen[r.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, len(ids))
	for id, n := range seen {
		require.Equal(t, 1, n, id)
	}
}

// A paused source's line waits: nothing is admitted, and the releaser is
// told to look again at the pause's end, not at once.
func TestAdmitReleasedWaitsForAPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.holdLine(t, "paused", 3)
	_, err := ingressstore.PauseSource(b.ctx, b.pool, "paused", nil, "", "test")
	require.NoError(t, err)

	require.Empty(t, b.admitReleased(t, 10))
	_, ok, err := ingressstore.NextReleaseSlot(b.ctx, b.pool)
	require.NoError(t, err)
	require.False(t, ok, "a pause without an end: nothing to wake for")

	// A due for a lined-up event is handed back to the line, and rolls
	// back: the event keeps its place.
	_, err = b.gateDueErr(t, "paused", "paused-0001")
	var le *ingressstore.LineError
	require.ErrorAs(t, err, &le)
	require.True(t, le.Until.After(le.Now), "until the slot plus the grace")
	require.Equal(t, 3, pgtest.Count(t, b.pool, `SELECT count(*) FROM event_source_holds WHERE source = 'paused' AND released`))
}

// A window never admits more than the limit, even from a line whose slots
// have all come: the rest waits for the next window, and the releaser is
// told to look again then, not at once.
func TestAdmitReleasedKeepsTheWindowsLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "capped", RateLimit: 3, RateWindow: time.Hour})
	ids := b.holdLine(t, "capped", 5)
	// Every slot has come (as when the releaser ran late).
	_, err := b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = slot_at - interval '1 day'`)
	require.NoError(t, err)
	// One admission of this window already.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO event_source_windows (source, window_start, admitted) VALUES ('capped', date_trunc('hour', now()), 1)
		ON CONFLICT (source, window_start) DO UPDATE SET admitted = 1`)
	require.NoError(t, err)

	got := b.admitReleased(t, 100)
	require.Equal(t, ids[:2], releasedIDs(got), "two more fill the window of 3")
	require.Empty(t, b.admitReleased(t, 100))
	wait, ok, err := ingressstore.NextReleaseSlot(b.ctx, b.pool)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, wait, time.Duration(0), "the next window, not now")
	require.LessOrEqual(t, wait, time.Hour)
}

// The line follows the INGEST sequence, not the order the gate deferred
// the events: with several evaluations at once, an event that arrived
// later can be deferred first. Both kinds of line, with and without a
// rate limit.
func TestReleaseLineFollowsIngestOrder(t *testing.T) {
	t.Parallel()
	for _, limited := range []bool{false, true} {
		t.Run(fmt.Sprintf("limited=%v", limited), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const source, n = "arrivals", 12
			if limited {
				_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: source, RateLimit: 1000, RateWindow: time.Second})
				require.NoError(t, err)
			}
			_, err := ingressstore.PauseSource(b.ctx, b.pool, source, nil, "", "test")
			require.NoError(t, err)
			// Deferred in the order i = 0..n-1, but arrived (INGEST
			// sequence) in reverse, with even-ish gaps as other sources'
			// events take sequences in between.
			want := make([]string, n)
			for i := range n {
				id := fmt.Sprintf("%s-%02d", source, i)
				seq := uint64(100 + 3*(n-i))
				ok, err := ingressstore.InsertEvent(b.ctx, b.pool, id, source, "invoice.paid", []byte(`{"id":"`+id+`"}`), seq)
				require.NoError(t, err)
				require.True(t, ok)
				b.deferPaused(t, id, source)
				want[n-1-i] = id
			}
			_, lined := b.resumeAndPace(t, source)
			require.EqualValues(t, n, lined)
			var got []string
			require.Eventually(t, func() bool {
				got = append(got, releasedIDs(b.admitReleased(t, 100))...)
				return len(got) >= n
			}, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, want, got)
		})
	}
}

// A throttled newcomer behind a release line does not pass the line's
// events whose slots have come: the releaser admits those at its next
// pass, and the newcomer's due, evaluated between the two, waits.
func TestNewcomerWaitsForTheReleaseLineAhead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const source = "behind"
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: source, RateLimit: 1000, RateWindow: time.Second})
	require.NoError(t, err)
	line := b.holdLine(t, source, 3)
	id, v := b.gateID(t, source, "invoice.paid")
	require.False(t, v.Admitted, "queued behind the line")
	require.Equal(t, ingressstore.ReasonSourceThrottled, v.Reason)
	// Its slot, and so every slot of the line ahead of it, has come.
	require.Eventually(t, func() bool {
		var come bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT slot_at <= now() FROM event_source_holds WHERE event_id = $1`, id).Scan(&come))
		return come
	}, 10*time.Second, 5*time.Millisecond)

	_, err = b.gateDueErr(t, source, id)
	var wait *ingressstore.WaitError
	require.ErrorAs(t, err, &wait, "the line ahead is admitted first")

	require.Equal(t, line, releasedIDs(b.admitReleased(t, 100)))
	require.True(t, b.gateDue(t, source, id).Admitted, "then its turn")
}
