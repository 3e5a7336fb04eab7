package ingressstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/projections/ingressstore"
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

// gate runs Gate in its own committed transaction, as the service does.
func (b *bundle) gate(t *testing.T, source, typ string) ingressstore.Verdict {
	t.Helper()
	var v ingressstore.Verdict
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		v, err = ingressstore.Gate(b.ctx, tx, source, typ)
		return err
	})
	require.NoError(t, err)
	return v
}

func (b *bundle) insertEvent(t *testing.T, id, source string) {
	t.Helper()
	ok, err := ingressstore.InsertEvent(b.ctx, b.pool, id, source, "invoice.paid", []byte(`{"id":"`+id+`"}`))
	require.NoError(t, err)
	require.True(t, ok)
}

func TestInsertEventStoresAnIDOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)

	ok, err := ingressstore.InsertEvent(b.ctx, b.pool, "ev-1", "billing", "invoice.paid", []byte(`{"v":1}`))
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = ingressstore.InsertEvent(b.ctx, b.pool, "ev-1", "other", "x.y", []byte(`{"v":2}`))
	require.NoError(t, err)
	require.False(t, ok, "a second insert of the same id is a no-op")

	ev, err := ingressstore.GetEvent(b.ctx, b.pool, "ev-1")
	require.NoError(t, err)
	require.Equal(t, "billing", ev.Source)
	require.Equal(t, ingressstore.StatusReceived, ev.Status)
	require.JSONEq(t, `{"v":1}`, string(ev.Envelope))
	require.Nil(t, ev.AdmittedAt)

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
	require.ErrorIs(t, err, ingressstore.ErrNotFound)
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
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "billing", RateLimit: 3, RateWindow: time.Hour})
	require.NoError(t, err)

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
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "paced", RateLimit: 2, RateWindow: time.Hour})
	require.NoError(t, err)
	require.True(t, b.gate(t, "paced", "invoice.paid").Admitted)
	require.True(t, b.gate(t, "paced", "invoice.paid").Admitted)
	var prev time.Time
	var first ingressstore.Verdict
	for i := range 5 {
		v := b.gate(t, "paced", "invoice.paid")
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

	// A new window with room, but three events still wait for their
	// slots: a new event queues behind them.
	_, err = b.pool.Exec(b.ctx, `UPDATE event_source_windows SET admitted = 0`)
	require.NoError(t, err)
	require.False(t, b.gate(t, "paced", "invoice.paid").Admitted)
	// The held event, back at its slot, is admitted.
	var v ingressstore.Verdict
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		v, err = ingressstore.GateDue(b.ctx, tx, "paced", "invoice.paid")
		return err
	}))
	require.True(t, v.Admitted)

	// A limit change drops the slots: the next event is admitted again.
	_, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "paced", RateLimit: 5, RateWindow: time.Hour})
	require.NoError(t, err)
	require.True(t, b.gate(t, "paced", "invoice.paid").Admitted)
}

func TestGateRejectedTransactionDoesNotCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "billing", RateLimit: 1, RateWindow: time.Hour})
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	v, err := ingressstore.Gate(b.ctx, tx, "billing", "invoice.paid")
	require.NoError(t, err)
	require.True(t, v.Admitted)
	require.NoError(t, tx.Rollback(b.ctx))

	require.True(t, b.gate(t, "billing", "invoice.paid").Admitted, "the rolled back admission freed its slot")
	require.False(t, b.gate(t, "billing", "invoice.paid").Admitted)
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
	require.ErrorIs(t, err, ingressstore.ErrNotFound)
}

func TestGateAllowedTypes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "billing", AllowedTypes: []string{"invoice.paid"}})
	require.NoError(t, err)
	require.True(t, b.gate(t, "billing", "invoice.paid").Admitted)

	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := ingressstore.Gate(b.ctx, tx, "billing", "invoice.voided")
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

	_, err = ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "a"})
	require.NoError(t, err)
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
	require.ErrorIs(t, err, ingressstore.ErrNotFound)
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
	require.ErrorIs(t, err, ingressstore.ErrNotFound)
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
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "s", RateLimit: 1, RateWindow: time.Minute})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO event_source_windows (source, window_start, admitted) VALUES
		('s', now() - interval '10 minutes', 1), ('s', now() - interval '30 seconds', 1), ('gone', now() - interval '2 minutes', 1)`)
	require.NoError(t, err)
	n, err := ingressstore.PruneWindows(b.ctx, b.pool, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	var left int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM event_source_windows`).Scan(&left))
	require.Equal(t, 1, left)
}

// A slot is exact in the database's precision even when rate_window /
// rate_limit is not a whole number of microseconds: the scheduler stores
// the slot in microseconds and the event's due brings that time back,
// which must not fall before the slot the gate recorded.
func TestGateSlotsAreWholeMicroseconds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := ingressstore.PutSource(b.ctx, b.pool, ingressstore.SourceConfig{Source: "odd", RateLimit: 7, RateWindow: time.Hour})
	require.NoError(t, err)
	for range 7 {
		require.True(t, b.gate(t, "odd", "invoice.paid").Admitted)
	}
	for range 3 {
		v := b.gate(t, "odd", "invoice.paid")
		require.False(t, v.Admitted)
		require.Equal(t, v.RetryAt.Truncate(time.Microsecond), v.RetryAt, "slot %s is not a whole microsecond", v.RetryAt.Format(time.RFC3339Nano))
	}
}
