package ingressstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
	"github.com/retryd/retryd/stores/pgdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, pool: pgtest.NewPool(t)}
}

// putSource stores a source's gate configuration.
func (b *bundle) putSource(t *testing.T, c ingressstore.SourceConfig) ingressstore.Source {
	t.Helper()
	src, err := ingressstore.PutSource(b.ctx, b.pool, c)
	require.NoError(t, err)
	return src
}

// gate runs Gate for a new event in its own committed transaction, as the
// service does, and returns the verdict; the event's id is the verdict's
// key in b.ids.
func (b *bundle) gate(t *testing.T, source, typ string) ingressstore.Verdict {
	t.Helper()
	_, v := b.gateID(t, source, typ)
	return v
}

// gateID is gate that also returns the new event's id.
func (b *bundle) gateID(t *testing.T, source, typ string) (string, ingressstore.Verdict) {
	t.Helper()
	id := fmt.Sprintf("ev-%d", eventSeq.Add(1))
	var v ingressstore.Verdict
	for {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			if v, err = ingressstore.Gate(b.ctx, tx, source, typ, id); err != nil {
				return err
			}
			return ingressstore.CountAdmission(b.ctx, tx, v)
		})
		// Lost the race for the last room of the window: rolled back,
		// evaluated again, as the service does.
		if errors.Is(err, ingressstore.ErrWindowFilled) {
			continue
		}
		require.NoError(t, err)
		return id, v
	}
}

// gateDue runs GateDue for event id's due.
func (b *bundle) gateDue(t *testing.T, source, id string) ingressstore.Verdict {
	t.Helper()
	v, err := b.gateDueErr(t, source, id)
	require.NoError(t, err)
	return v
}

// gateDueErr is gateDue for a due that may be handed back: it returns
// GateDue's error, and rolls back on one as the service does.
func (b *bundle) gateDueErr(t *testing.T, source, id string) (ingressstore.Verdict, error) {
	t.Helper()
	var v ingressstore.Verdict
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if v, err = ingressstore.GateDue(b.ctx, tx, source, "invoice.paid", id); err != nil {
			return err
		}
		return ingressstore.CountAdmission(b.ctx, tx, v)
	})
	return v, err
}

var eventSeq atomic.Int64

func (b *bundle) insertEvent(t *testing.T, id, source string) {
	t.Helper()
	ok, err := ingressstore.InsertEvent(b.ctx, b.pool, id, source, "invoice.paid", []byte(`{"id":"`+id+`"}`), 0)
	require.NoError(t, err)
	require.True(t, ok)
}

func TestInsertEventStoresAnIDOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)

	ok, err := ingressstore.InsertEvent(b.ctx, b.pool, "ev-1", "billing", "invoice.paid", []byte(`{"v":1}`), 1)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = ingressstore.InsertEvent(b.ctx, b.pool, "ev-1", "other", "x.y", []byte(`{"v":2}`), 2)
	require.NoError(t, err)
	require.False(t, ok, "a second insert of the same id is a no-op")

	ev, err := ingressstore.GetEvent(b.ctx, b.pool, "ev-1")
	require.NoError(t, err)
	require.Equal(t, "billing", ev.Source)
	require.Equal(t, ingressstore.StatusReceived, ev.Status)
	require.JSONEq(t, `{"v":1}`, string(ev.Envelope))
	require.Nil(t, ev.AdmittedAt)
	var seq int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ingest_seq FROM workflow_events WHERE event_id = 'ev-1'`).Scan(&seq))
	require.EqualValues(t, 1, seq, "a redelivery keeps the event's place in arrival order")

	changed, err := ingressstore.SetEventStatus(b.ctx, b.pool, "ev-1", ingressstore.StatusAdmitted, ingressstore.StatusReceived)
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = ingressstore.SetEventStatus(b.ctx, b.pool, "ev-1", ingressstore.StatusDeferred, ingressstore.StatusReceived)
	require.NoError(t, err)
	require.False(t, changed, "status guard: admitted is not received")
	ev, err = ingressstore.GetEvent(b.ctx, b.pool, "ev-1")
	require.NoError(t, err)
	require.Equal(t, ingressstore.StatusAdmitted, ev.Status)
	require.NotNil(t, ev.AdmittedAt)

	_, err = ingressstore.GetEvent(b.ctx, b.pool, "missing")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

// The gate counts an admission in the rate window of its decision, which
// its transaction may have begun before: admitted_at is the decision's
// time, so the window it counts in can be read from it.
func TestAdmitEventAtSetsTheDecisionTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var decided time.Time
	ev, txStart := b.admitAt(t, "ev-at", func(tx pgx.Tx, txStart time.Time) {
		decided = txStart.Add(150 * time.Millisecond).UTC().Truncate(time.Microsecond)
		changed, err := ingressstore.AdmitEventAt(b.ctx, tx, "ev-at", decided, ingressstore.StatusDeferred)
		require.NoError(t, err)
		require.False(t, changed, "status guard: received is not deferred")
		changed, err = ingressstore.AdmitEventAt(b.ctx, tx, "ev-at", decided, ingressstore.StatusReceived)
		require.NoError(t, err)
		require.True(t, changed)
	})
	require.Equal(t, ingressstore.StatusAdmitted, ev.Status)
	require.True(t, decided.Equal(*ev.AdmittedAt), "admitted_at %s, decided %s (transaction began %s)", ev.AdmittedAt, decided, txStart)
}

// A source with no gate row has no window: the gate's verdict carries no
// decision time, and admitted_at is the transaction's.
func TestAdmitEventAtZeroTimeIsTheTransactionTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev, txStart := b.admitAt(t, "ev-zero", func(tx pgx.Tx, _ time.Time) {
		changed, err := ingressstore.AdmitEventAt(b.ctx, tx, "ev-zero", time.Time{}, ingressstore.StatusReceived)
		require.NoError(t, err)
		require.True(t, changed)
	})
	require.True(t, txStart.Equal(*ev.AdmittedAt), "admitted_at %s, transaction began %s", ev.AdmittedAt, txStart)
}

// admitAt stores event id as received, runs admit in a transaction that
// began at txStart (its now()), commits, and reads the event back.
func (b *bundle) admitAt(t *testing.T, id string, admit func(tx pgx.Tx, txStart time.Time)) (ingressstore.Event, time.Time) {
	t.Helper()
	_, err := ingressstore.InsertEvent(b.ctx, b.pool, id, "billing", "x.y", []byte(`{}`), 1)
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // no-op after commit
	var txStart time.Time
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT now()`).Scan(&txStart))
	admit(tx, txStart)
	require.NoError(t, tx.Commit(b.ctx))
	ev, err := ingressstore.GetEvent(b.ctx, b.pool, id)
	require.NoError(t, err)
	require.NotNil(t, ev.AdmittedAt)
	return ev, txStart
}

func TestGateWithoutSourceRowAdmits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := b.gate(t, "unknown", "a.b")
	require.True(t, v.Admitted)
}

func TestGateRateLimitIsSharedByConcurrentTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "billing", RateLimit: 3, RateWindow: time.Hour})

	// Ten "instances" evaluate at once; the window must hold exactly three.
	var mu sync.Mutex
	var verdicts []ingressstore.Verdict
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			v := b.gate(t, "billing", "invoice.paid")
			mu.Lock()
			verdicts = append(verdicts, v)
			mu.Unlock()
		})
	}
	wg.Wait()
	admitted := 0
	slots := map[time.Time]int{}
	for _, v := range verdicts {
		if v.Admitted {
			admitted++
			continue
		}
		require.Equal(t, ingressstore.ReasonSourceThrottled, v.Reason)
		require.Contains(t, v.Detail, "3 per 1h0m0s")
		require.True(t, v.RetryAt.After(v.Now), "retry after the window's end")
		require.Zero(t, v.RetryAt.UnixMilli()%(20*time.Minute).Milliseconds(), "a slot: windows aligned on the epoch, 3 slots each")
		slots[v.RetryAt]++
	}
	require.Equal(t, 3, admitted)
	for at, n := range slots {
		require.Equal(t, 1, n, "one event per slot, %s", at)
	}
}

// Throttled events take the next free slot in arrival order, at most
// rate_limit per window, each at its own time; while some wait, a new event
// queues behind them even when its window has room, and a held event that
// comes back at its slot (GateDue) is admitted.
func TestGateSlotsAreOrderedAndPaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "paced", RateLimit: 2, RateWindow: time.Hour})
	require.True(t, b.gate(t, "paced", "invoice.paid").Admitted)
	require.True(t, b.gate(t, "paced", "invoice.paid").Admitted)
	var prev time.Time
	var first ingressstore.Verdict
	var ids []string
	for i := range 5 {
		id, v := b.gateID(t, "paced", "invoice.paid")
		ids = append(ids, id)
		require.False(t, v.Admitted)
		if i == 0 {
			first = v
			end := v.Now.Truncate(time.Hour).Add(time.Hour)
			require.True(t, v.RetryAt.Equal(end), "the first slot opens the next window: %s", v.RetryAt)
		} else {
			require.Equal(t, 30*time.Minute, v.RetryAt.Sub(prev), "slots are rate_window/rate_limit apart, in arrival order")
		}
		prev = v.RetryAt
	}
	require.Contains(t, first.Detail, "slot 1 of the window")

	// A new window with room, but held events still wait for their
	// slots: a new event queues behind them.
	_, err := b.pool.Exec(b.ctx, `UPDATE event_source_windows SET admitted = 0`)
	require.NoError(t, err)
	require.False(t, b.gate(t, "paced", "invoice.paid").Admitted)
	// The first held event, back at its slot, is admitted.
	require.True(t, b.gateDue(t, "paced", ids[0]).Admitted)

	// A limit change drops the slots: the next event is admitted again.
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "paced", RateLimit: 5, RateWindow: time.Hour})
	require.True(t, b.gate(t, "paced", "invoice.paid").Admitted)
}

// A slot holder keeps its place until its due is evaluated, however late
// the due arrives: newcomers queue behind it after its slot time has
// passed, and it does not queue behind them. Late into a full window whose
// next free turn is far (an hour here), it is held again for that turn in
// the same place: the limit holds for the admissions downstream sees. A
// due brought forward before its slot, or a paused holder, gives the slot
// up.
const day = 24 * time.Hour

func TestGateSlotHolderKeepsItsPlaceWhenLate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A day's window: a turn in the next window is more than maxTurnWait
	// away (a hold, not a wait) except in the day's last minute (with an
	// hour's, the test failed in every hour's last minute).
	b.putSource(t, ingressstore.SourceConfig{Source: "late", RateLimit: 1, RateWindow: day})
	require.True(t, b.gate(t, "late", "invoice.paid").Admitted)
	holder, v := b.gateID(t, "late", "invoice.paid")
	require.False(t, v.Admitted)
	early, ve := b.gateID(t, "late", "invoice.paid")
	require.False(t, ve.Admitted)

	// The holders' slots pass while their dues are still on the way, and
	// the current window has room: a newcomer still queues behind them.
	slotAt := func(id string, ago time.Duration) time.Time {
		var at time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `UPDATE event_source_holds SET slot_at = now() - $2 * interval '1 millisecond'
			WHERE event_id = $1 RETURNING slot_at`, id, ago.Milliseconds()).Scan(&at))
		return at
	}
	slotAt(holder, 2*time.Minute)
	earlyAt := slotAt(early, time.Minute)
	_, err := b.pool.Exec(b.ctx, `UPDATE event_source_windows SET admitted = 0`)
	require.NoError(t, err)
	newcomer, vn := b.gateID(t, "late", "invoice.paid")
	require.False(t, vn.Admitted, "a newcomer queues behind holders whose dues have not come")
	require.True(t, vn.RetryAt.After(earlyAt), "behind the last holder")

	// The late holder is admitted in a window with room, ahead of the
	// newcomer queued behind it.
	require.True(t, b.gateDue(t, "late", holder).Admitted, "a late holder owns its slot")
	// A second due of the same holder is a newcomer: it holds no slot any more.
	require.False(t, b.gateDue(t, "late", holder).Admitted)

	// Late into a full window, one holder (early) ahead of it: its turn is
	// two windows on, an hour away, so it is held again for that turn and
	// keeps its place in line.
	_, err = b.pool.Exec(b.ctx, `UPDATE event_source_windows SET admitted = 1`)
	require.NoError(t, err)
	var placeBefore time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT slot_at FROM event_source_holds WHERE event_id = $1`, newcomer).Scan(&placeBefore))
	vl := b.gateDue(t, "late", newcomer)
	require.False(t, vl.Admitted, "a full window admits no late holder")
	require.Equal(t, ingressstore.ReasonSourceThrottled, vl.Reason)
	require.Contains(t, vl.Detail, "1 held events ahead")
	require.True(t, vl.Now.Truncate(day).Add(2*day).Equal(vl.RetryAt), "behind the one ahead, in the window after next: %s", vl.RetryAt)
	var placeAfter time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT slot_at FROM event_source_holds WHERE event_id = $1`, newcomer).Scan(&placeAfter))
	require.True(t, placeAfter.Equal(placeBefore), "held again in the same place")
	slotAt(newcomer, 0)

	// A due brought forward before its slot keeps its place: the window
	// is full, so it is held again for the next one, ahead of the
	// newcomer behind it.
	vb := b.gateDue(t, "late", early)
	require.False(t, vb.Admitted)
	require.True(t, vb.RetryAt.Before(vl.RetryAt), "a due brought forward keeps its place ahead of %s: %s", vl.RetryAt, vb.RetryAt)
	var earlyPlace time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT slot_at FROM event_source_holds WHERE event_id = $1`, early).Scan(&earlyPlace))
	require.True(t, earlyPlace.Equal(earlyAt), "held again in the same place")

	// A paused holder gives its slot up; an event that leaves deferred too.
	_, err = ingressstore.PauseSource(b.ctx, b.pool, "late", nil, "", "test")
	require.NoError(t, err)
	vp := b.gateDue(t, "late", newcomer)
	require.Equal(t, ingressstore.ReasonSourcePaused, vp.Reason)
	for _, id := range []string{early, holder} {
		b.insertEvent(t, id, "late")
		_, err = ingressstore.SetEventStatus(b.ctx, b.pool, id, ingressstore.StatusCancelled)
		require.NoError(t, err)
	}
	require.Zero(t, pgtest.Count(t, b.pool, `SELECT count(*) FROM event_source_holds`), "no holds left")
}

// Holders whose dues come late keep their line: a holder is admitted only
// when the window has room for it behind every holder still ahead of it;
// otherwise its due is handed back (a WaitError, the transaction rolled
// back, the hold untouched) until its turn, in line order, never over the
// limit.
func TestGateLateHoldersWaitForTheirTurnInLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const window = 20 * time.Second
	b.putSource(t, ingressstore.SourceConfig{Source: "line", RateLimit: 1, RateWindow: window})
	require.True(t, b.gate(t, "line", "invoice.paid").Admitted)
	first, v1 := b.gateID(t, "line", "invoice.paid")
	second, v2 := b.gateID(t, "line", "invoice.paid")
	require.False(t, v1.Admitted)
	require.False(t, v2.Admitted)

	// Both slots have passed (their dues came late).
	_, err := b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = slot_at - interval '2 minutes'`)
	require.NoError(t, err)
	place := func(id string) time.Time {
		var at time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT slot_at FROM event_source_holds WHERE event_id = $1`, id).Scan(&at))
		return at
	}
	secondAt, firstAt := place(second), place(first)
	// fill sets the current window and the next two to n admissions, so a
	// window that turns during the test changes nothing.
	fill := func(n int) {
		_, err := b.pool.Exec(b.ctx, `
			INSERT INTO event_source_windows (source, window_start, admitted)
			SELECT 'line', to_timestamp(floor(extract(epoch FROM now()) / 20) * 20 + k * 20), $1 FROM generate_series(0, 2) k
			ON CONFLICT (source, window_start) DO UPDATE SET admitted = EXCLUDED.admitted`, n)
		require.NoError(t, err)
	}
	waits := func(id string, ahead int) {
		t.Helper()
		_, err := b.gateDueErr(t, "line", id)
		var wait *ingressstore.WaitError
		require.ErrorAs(t, err, &wait)
		require.Equal(t, ahead, wait.Ahead)
		require.WithinRange(t, wait.Until, wait.Now, wait.Now.Add(3*window), "a turn within the next windows, on the database clock")
	}

	// A full window: the second waits, behind the first.
	fill(1)
	waits(second, 1)
	require.True(t, place(second).Equal(secondAt), "waiting rolls back: the hold keeps its place")
	// A window with room, but the first still ahead: the second waits for
	// it rather than pass it.
	fill(0)
	waits(second, 1)
	require.True(t, place(first).Equal(firstAt))

	// The head of the line is admitted; in a full window the second, now
	// first in line, waits for the next.
	require.True(t, b.gateDue(t, "line", first).Admitted, "the head of the line is admitted")
	fill(1)
	waits(second, 0)

	// Its turn: admitted, and the line is empty.
	fill(0)
	require.True(t, b.gateDue(t, "line", second).Admitted)
	require.Zero(t, pgtest.Count(t, b.pool, `SELECT count(*) FROM event_source_holds`))
}

// A holder whose turn is handed back (MarkWaiting) is not passed by the
// holders behind it, even where the window would have room for both: they
// wait until right after its turn.
func TestGateHoldersDoNotPassAWaitingHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putSource(t, ingressstore.SourceConfig{Source: "pass", RateLimit: 5, RateWindow: 20 * time.Second})
	for range 5 {
		require.True(t, b.gate(t, "pass", "invoice.paid").Admitted)
	}
	first, _ := b.gateID(t, "pass", "invoice.paid")
	second, _ := b.gateID(t, "pass", "invoice.paid")
	_, err := b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = slot_at - interval '2 minutes'`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `DELETE FROM event_source_windows`)
	require.NoError(t, err)

	until := time.Now().Add(5 * time.Second).Truncate(time.Microsecond)
	require.NoError(t, ingressstore.MarkWaiting(b.ctx, b.pool, first, until))
	_, err = b.gateDueErr(t, "pass", second)
	var wait *ingressstore.WaitError
	require.ErrorAs(t, err, &wait, "room in the window, but the one ahead waits")
	require.Equal(t, 1, wait.Ahead)
	require.False(t, wait.Until.Before(until), "right after the waiting holder's turn: %s", wait.Until)

	require.True(t, b.gateDue(t, "pass", first).Admitted)
	require.True(t, b.gateDue(t, "pass", second).Admitted, "nobody ahead any more")
}

// A holder whose slot has come and whose due has not been decided yet (it
// was handed back a moment ago, or is on its way) is not passed by the
// holder behind it, even with room in the window: that one waits right
// after it. One whose slot passed more than turnLate (100 ms) ago is not
// waited for: its due may be lost.
func TestGateHoldersDoNotPassAHolderWhoseSlotCame(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putSource(t, ingressstore.SourceConfig{Source: "come", RateLimit: 5, RateWindow: day})
	for range 5 {
		require.True(t, b.gate(t, "come", "invoice.paid").Admitted)
	}
	first, _ := b.gateID(t, "come", "invoice.paid")
	second, _ := b.gateID(t, "come", "invoice.paid")
	third, _ := b.gateID(t, "come", "invoice.paid")
	_, err := b.pool.Exec(b.ctx, `DELETE FROM event_source_windows`)
	require.NoError(t, err)
	// first's slot came 10 ms ago, second's just now; third's long ago,
	// but it is behind them.
	for id, ago := range map[string]string{first: "10 milliseconds", second: "5 milliseconds"} {
		_, err = b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = now() - $2::interval WHERE event_id = $1`, id, ago)
		require.NoError(t, err)
	}

	_, err = b.gateDueErr(t, "come", second)
	var wait *ingressstore.WaitError
	require.ErrorAs(t, err, &wait, "room in the window, but the one ahead has its slot and is not admitted")
	require.True(t, wait.Behind)
	require.Equal(t, 1, wait.Ahead)
	require.Less(t, wait.Until.Sub(wait.Now), time.Second, "a recheck in a moment, not the next window")

	require.True(t, b.gateDue(t, "come", first).Admitted)
	require.True(t, b.gateDue(t, "come", second).Admitted, "nobody ahead any more")

	// The one ahead's slot passed long ago: its due may be lost, and the
	// line goes on without it.
	fourth, _ := b.gateID(t, "come", "invoice.paid")
	_, err = b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = now() - interval '1 second' WHERE event_id = $1`, third)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = now() WHERE event_id = $1`, fourth)
	require.NoError(t, err)
	require.True(t, b.gateDue(t, "come", fourth).Admitted, "a holder late by more than 100 ms is not waited for")
}

func TestGateRejectedTransactionDoesNotCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "billing", RateLimit: 1, RateWindow: time.Hour})
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	v, err := ingressstore.Gate(b.ctx, tx, "billing", "invoice.paid", "ev-rolled-back")
	require.NoError(t, err)
	require.True(t, v.Admitted)
	require.NoError(t, tx.Rollback(b.ctx))

	require.True(t, b.gate(t, "billing", "invoice.paid").Admitted, "the rolled back admission freed its slot")
	require.False(t, b.gate(t, "billing", "invoice.paid").Admitted)
}

// Two gates that decide at once for the last room of a window: both
// admit, and the count each makes last before its commit lets one through
// and tells the other the window filled (it rolls back and looks again).
func TestGateRaceForTheLastRoomCountsOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "race", RateLimit: 1, RateWindow: time.Hour})
	var txs []pgx.Tx
	var verdicts []ingressstore.Verdict
	for _, id := range []string{"ev-a", "ev-b"} {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		v, err := ingressstore.Gate(b.ctx, tx, "race", "invoice.paid", id)
		require.NoError(t, err)
		require.True(t, v.Admitted, "each sees room")
		txs, verdicts = append(txs, tx), append(verdicts, v)
	}
	require.NoError(t, ingressstore.CountAdmission(b.ctx, txs[0], verdicts[0]))
	require.NoError(t, txs[0].Commit(b.ctx))
	err := ingressstore.CountAdmission(b.ctx, txs[1], verdicts[1])
	require.ErrorIs(t, err, ingressstore.ErrWindowFilled)
	require.NoError(t, txs[1].Rollback(b.ctx))
	var admitted int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sum(admitted) FROM event_source_windows WHERE source = 'race'`).Scan(&admitted))
	require.Equal(t, 1, admitted)
}

func TestGatePause(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := ingressstore.PauseSource(b.ctx, b.pool, "crm", nil, "maintenance", "test")
	require.NoError(t, err)
	v := b.gate(t, "crm", "contact.created")
	require.False(t, v.Admitted)
	require.Equal(t, ingressstore.ReasonSourcePaused, v.Reason)
	require.True(t, v.RetryAt.IsZero(), "an indefinite pause gives no hint")

	until := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	_, err = ingressstore.PauseSource(b.ctx, b.pool, "crm", &until, "", "test")
	require.NoError(t, err)
	v = b.gate(t, "crm", "contact.created")
	require.False(t, v.Admitted)
	require.True(t, until.Equal(v.RetryAt), "retry at the end of the pause: %s vs %s", until, v.RetryAt)

	past := time.Now().Add(-time.Minute)
	_, err = ingressstore.PauseSource(b.ctx, b.pool, "crm", &past, "", "test")
	require.NoError(t, err)
	require.True(t, b.gate(t, "crm", "contact.created").Admitted, "an expired pause admits")

	_, err = ingressstore.PauseSource(b.ctx, b.pool, "crm", nil, "", "test")
	require.NoError(t, err)
	src, err := ingressstore.ResumeSource(b.ctx, b.pool, "crm", "test")
	require.NoError(t, err)
	require.False(t, src.Paused)
	require.True(t, b.gate(t, "crm", "contact.created").Admitted)

	_, err = ingressstore.ResumeSource(b.ctx, b.pool, "nope", "test")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

func TestGateAllowedTypes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putSource(t, ingressstore.SourceConfig{Source: "billing", AllowedTypes: []string{"invoice.paid"}})
	require.True(t, b.gate(t, "billing", "invoice.paid").Admitted)

	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := ingressstore.Gate(b.ctx, tx, "billing", "invoice.voided", "ev-voided")
		return err
	})
	require.ErrorIs(t, err, ingressstore.ErrTypeNotAllowed)
	require.ErrorContains(t, err, `"invoice.voided"`)

	types, err := ingressstore.AllowedTypes(b.ctx, b.pool, "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"invoice.paid"}, types)
	types, err = ingressstore.AllowedTypes(b.ctx, b.pool, "none")
	require.NoError(t, err)
	require.Empty(t, types)
}

func TestSources(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "a", RateLimit: 5})
	require.ErrorContains(t, err, "set together")
	_, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "a", RateLimit: 5, RateWindow: time.Microsecond})
	require.ErrorContains(t, err, "at least 1ms")

	until := time.Now().Add(time.Hour)
	_, err = ingressstore.PauseSource(b.ctx, b.pool, "b", &until, "why", "op")
	require.NoError(t, err)
	src, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "b", RateLimit: 5, RateWindow: 2 * time.Second, UpdatedBy: "op2"})
	require.NoError(t, err)
	require.True(t, src.Paused, "put keeps the pause")
	require.Equal(t, "why", src.PauseReason)
	require.Equal(t, 5, *src.RateLimit)
	require.Equal(t, 2*time.Second, src.RateWindow)
	require.Equal(t, "op2", src.UpdatedBy)
	require.Equal(t, []string{}, src.AllowedTypes)

	src, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "b"})
	require.NoError(t, err)
	require.Nil(t, src.RateLimit, "put without a limit removes it")

	b.putSource(t, ingressstore.SourceConfig{Source: "a"})
	b.insertEvent(t, "e1", "a")
	_, err = ingressstore.SetEventStatus(b.ctx, b.pool, "e1", ingressstore.StatusDeferred)
	require.NoError(t, err)

	list, err := ingressstore.ListSources(b.ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "a", list[0].Source)
	require.EqualValues(t, 1, list[0].Deferred)
	require.Equal(t, "b", list[1].Source)

	got, err := ingressstore.GetSource(b.ctx, b.pool, "a")
	require.NoError(t, err)
	require.EqualValues(t, 1, got.Deferred)
	_, err = ingressstore.GetSource(b.ctx, b.pool, "zzz")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

func TestRetryRowLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertEvent(t, "ev", "billing")

	retryAt := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	require.NoError(t, ingressstore.RecordDeferral(b.ctx, b.pool, ingressstore.Deferral{
		EventID: "ev", Source: "billing", Attempt: 1, Reason: ingressstore.ReasonSourceThrottled,
		Detail: "rate limit of 1 per 1s reached", Class: "rate_limit", RetryAt: retryAt,
	}))
	r, err := ingressstore.GetRetry(b.ctx, b.pool, "ev")
	require.NoError(t, err)
	require.Equal(t, ingressstore.RetryScheduled, r.State)
	require.Equal(t, 1, r.Attempts)
	require.False(t, r.Confirmed())
	require.Equal(t, "source_throttled: rate limit of 1 per 1s reached", r.LastError)
	require.True(t, retryAt.Equal(*r.NextAttemptAt))
	require.Equal(t, "rate_limit", r.Metadata["class"])
	require.Equal(t, retryAt.Format(time.RFC3339Nano), r.Metadata["retry_after"])

	unconfirmed := func() []string {
		var ids []string
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			rs, err := ingressstore.Unconfirmed(b.ctx, tx, 0, 10)
			for _, r := range rs {
				ids = append(ids, r.EventID)
			}
			return err
		})
		require.NoError(t, err)
		return ids
	}
	require.Equal(t, []string{"ev"}, unconfirmed())

	next := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Millisecond)
	ok, err := ingressstore.ConfirmScheduled(b.ctx, b.pool, "ev", 1, next, nil)
	require.NoError(t, err)
	require.False(t, ok, "attempt 1 was already evaluated")
	ok, err = ingressstore.ConfirmScheduled(b.ctx, b.pool, "ev", 2, next, map[string]any{"decided_by": "throttle"})
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, unconfirmed())
	r, err = ingressstore.GetRetry(b.ctx, b.pool, "ev")
	require.NoError(t, err)
	require.True(t, r.Confirmed())
	require.True(t, next.Equal(*r.NextAttemptAt))
	require.Equal(t, "throttle", r.Metadata["decided_by"])

	// Attempt 2 is rejected again: unconfirmed until attempt 3 is scheduled;
	// a late confirmation of attempt 2 changes nothing.
	require.NoError(t, ingressstore.RecordDeferral(b.ctx, b.pool, ingressstore.Deferral{
		EventID: "ev", Source: "billing", Attempt: 2, Reason: ingressstore.ReasonSourcePaused, Class: "temporary",
	}))
	r, err = ingressstore.GetRetry(b.ctx, b.pool, "ev")
	require.NoError(t, err)
	require.Nil(t, r.NextAttemptAt)
	require.NotContains(t, r.Metadata, "retry_after", "a deferral without a hint drops the old one")
	require.Equal(t, []string{"ev"}, unconfirmed())
	ok, err = ingressstore.ConfirmScheduled(b.ctx, b.pool, "ev", 2, next, nil)
	require.NoError(t, err)
	require.False(t, ok)

	require.NoError(t, ingressstore.CompleteRetry(b.ctx, b.pool, "ev", 3))
	ok, err = ingressstore.ResolveRetry(b.ctx, b.pool, "ev", ingressstore.RetryCancelled, "late")
	require.NoError(t, err)
	require.False(t, ok, "a completed deferral stays completed")
	ok, err = ingressstore.ConfirmScheduled(b.ctx, b.pool, "ev", 4, next, nil)
	require.NoError(t, err)
	require.False(t, ok)
	r, err = ingressstore.GetRetry(b.ctx, b.pool, "ev")
	require.NoError(t, err)
	require.Equal(t, ingressstore.RetryCompleted, r.State)
	require.Equal(t, 3, r.Attempts)

	_, err = ingressstore.ResolveRetry(b.ctx, b.pool, "ev", ingressstore.RetryCompleted, "")
	require.Error(t, err)
	_, err = ingressstore.GetRetry(b.ctx, b.pool, "missing")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

func TestUnconfirmedSkipsRecentAndLockedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, id := range []string{"a", "b"} {
		b.insertEvent(t, id, "s")
		require.NoError(t, ingressstore.RecordDeferral(b.ctx, b.pool, ingressstore.Deferral{EventID: id, Source: "s", Attempt: 1, Reason: "source_paused"}))
	}
	tx1, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(b.ctx) }()
	first, err := ingressstore.Unconfirmed(b.ctx, tx1, 0, 1)
	require.NoError(t, err)
	require.Len(t, first, 1)

	tx2, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx2.Rollback(b.ctx) }()
	second, err := ingressstore.Unconfirmed(b.ctx, tx2, 0, 10)
	require.NoError(t, err)
	require.Len(t, second, 1, "the row locked by the other instance is skipped")
	require.NotEqual(t, first[0].EventID, second[0].EventID)

	recent, err := ingressstore.Unconfirmed(b.ctx, b.pool, time.Hour, 10)
	require.NoError(t, err)
	require.Empty(t, recent)
}

func TestPruneWindows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putSource(t, ingressstore.SourceConfig{Source: "s", RateLimit: 1, RateWindow: time.Minute})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO event_source_windows (source, window_start, admitted) VALUES
		('s', now() - interval '10 minutes', 1), ('s', now() - interval '30 seconds', 1), ('gone', now() - interval '2 minutes', 1)`)
	require.NoError(t, err)
	n, err := ingressstore.PruneWindows(b.ctx, b.pool, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, 1, pgtest.Count(t, b.pool, `SELECT count(*) FROM event_source_windows`))
}

// A slot is exact in the database's precision even when rate_window /
// rate_limit is not a whole number of microseconds: the scheduler stores
// the slot in microseconds and the event's due brings that time back,
// which must not fall before the slot the gate recorded.
func TestGateSlotsAreWholeMicroseconds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	servicetest.ClearOfWindowEdge(t, time.Hour, 10*time.Second)
	b.putSource(t, ingressstore.SourceConfig{Source: "odd", RateLimit: 7, RateWindow: time.Hour})
	for range 7 {
		require.True(t, b.gate(t, "odd", "invoice.paid").Admitted)
	}
	for range 3 {
		v := b.gate(t, "odd", "invoice.paid")
		require.False(t, v.Admitted)
		require.Equal(t, v.RetryAt.Truncate(time.Microsecond), v.RetryAt, "slot %s is not a whole microsecond", v.RetryAt.Format(time.RFC3339Nano))
	}
}
