package triggerstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{ctx: context.Background(), pool: pgtest.NewPool(t)}
}

func definition() triggerstore.Definition {
	return triggerstore.Definition{
		Name: "paid invoices", Source: "billing", EventType: "invoice.paid",
		Predicate: "data.amount > 100.0", ThrottleLimit: 3, ThrottleWindow: 1500 * time.Millisecond,
		ThrottleKey: "data.customer", MaxConcurrency: 2, Workflow: "onboard", Enabled: true,
	}
}

func TestTriggerLifecycleVersions(t *testing.T) {
	t.Parallel()
	b := setup(t)

	created, err := triggerstore.CreateTrigger(b.ctx, b.pool, "t1", definition())
	require.NoError(t, err)
	require.Equal(t, 1, created.Version)
	require.Equal(t, definition(), created.Definition)

	_, err = triggerstore.CreateTrigger(b.ctx, b.pool, "t1", definition())
	require.ErrorIs(t, err, pgdb.ErrConflict)

	same, changed, err := triggerstore.UpdateTrigger(b.ctx, b.pool, "t1", definition())
	require.NoError(t, err)
	require.False(t, changed, "an identical definition is not a change")
	require.Equal(t, 1, same.Version)

	d := definition()
	d.ThrottleLimit, d.ThrottleWindow, d.ThrottleKey, d.MaxConcurrency = 0, 0, "", 0
	updated, changed, err := triggerstore.UpdateTrigger(b.ctx, b.pool, "t1", d)
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, 2, updated.Version)
	require.Equal(t, d, updated.Definition, "zero limits round-trip through NULL")

	disabled, changed, err := triggerstore.SetEnabled(b.ctx, b.pool, "t1", false)
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, 3, disabled.Version)
	require.False(t, disabled.Enabled)
	_, changed, err = triggerstore.SetEnabled(b.ctx, b.pool, "t1", false)
	require.NoError(t, err)
	require.False(t, changed)

	deleted, err := triggerstore.DeleteTrigger(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, 4, deleted.Version)
	require.True(t, deleted.Deleted())

	_, err = triggerstore.GetTrigger(b.ctx, b.pool, "t1")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	_, err = triggerstore.DeleteTrigger(b.ctx, b.pool, "t1")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	_, _, err = triggerstore.UpdateTrigger(b.ctx, b.pool, "t1", d)
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	_, err = triggerstore.CreateTrigger(b.ctx, b.pool, "t1", definition())
	require.ErrorIs(t, err, pgdb.ErrConflict, "ids of deleted triggers are not reused")

	versions, err := triggerstore.ListVersions(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Len(t, versions, 4)
	require.Equal(t, definition(), versions[0].Definition)
	require.Equal(t, d, versions[1].Definition)
	require.False(t, versions[2].Definition.Enabled)
	require.True(t, versions[3].Deleted)

	_, err = triggerstore.ListVersions(b.ctx, b.pool, "nope")
	require.ErrorIs(t, err, pgdb.ErrNotFound)

	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		locked, err := triggerstore.LockTrigger(b.ctx, tx, "t1")
		require.NoError(t, err)
		require.True(t, locked.Deleted(), "LockTrigger sees deleted triggers")
		return nil
	})
	require.NoError(t, err)
}

func TestListAndMatchTriggers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, id := range []string{"a", "b", "c", "d"} {
		d := definition()
		d.Enabled = i != 1
		if i == 3 {
			d.EventType = "invoice.voided"
		}
		_, err := triggerstore.CreateTrigger(b.ctx, b.pool, id, d)
		require.NoError(t, err)
	}
	_, err := triggerstore.DeleteTrigger(b.ctx, b.pool, "c")
	require.NoError(t, err)

	ids, err := triggerstore.MatchingTriggerIDs(b.ctx, b.pool, "billing", "invoice.paid")
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, ids, "disabled, deleted and other types do not match")

	all, err := triggerstore.ListTriggers(b.ctx, b.pool, triggerstore.ListTriggersOptions{Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, triggerIDs(all))
	next, err := triggerstore.ListTriggers(b.ctx, b.pool, triggerstore.ListTriggersOptions{After: "b"})
	require.NoError(t, err)
	require.Equal(t, []string{"d"}, triggerIDs(next))

	enabled := false
	off, err := triggerstore.ListTriggers(b.ctx, b.pool, triggerstore.ListTriggersOptions{Enabled: &enabled})
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, triggerIDs(off))
	voided, err := triggerstore.ListTriggers(b.ctx, b.pool, triggerstore.ListTriggersOptions{Source: "billing", EventType: "invoice.voided"})
	require.NoError(t, err)
	require.Equal(t, []string{"d"}, triggerIDs(voided))
}

func triggerIDs(ts []triggerstore.Trigger) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

func delivery(id, eventID string, status triggerstore.Status) triggerstore.Delivery {
	return triggerstore.Delivery{
		ID: id, TriggerID: "t1", TriggerVersion: 1, EventID: eventID, Source: "billing",
		EventType: "invoice.paid", Status: status, RetryState: triggerstore.RetryNone,
	}
}

func TestDeliveriesStoredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := delivery("D1", "e1", triggerstore.StatusFiltered)
	d.StatusReason = "predicate_false"
	inserted, err := triggerstore.InsertDelivery(b.ctx, b.pool, d)
	require.NoError(t, err)
	require.True(t, inserted)

	again := delivery("D1", "e1", triggerstore.StatusLaunched)
	inserted, err = triggerstore.InsertDelivery(b.ctx, b.pool, again)
	require.NoError(t, err)
	require.False(t, inserted)
	other := delivery("D2", "e1", triggerstore.StatusLaunched)
	inserted, err = triggerstore.InsertDelivery(b.ctx, b.pool, other)
	require.NoError(t, err)
	require.False(t, inserted, "(event, trigger) is unique too")

	got, err := triggerstore.GetDelivery(b.ctx, b.pool, "D1")
	require.NoError(t, err)
	require.Equal(t, triggerstore.StatusFiltered, got.Status)
	require.Equal(t, "predicate_false", got.StatusReason)

	bad := delivery("D3", "e3", "bogus")
	_, err = triggerstore.InsertDelivery(b.ctx, b.pool, bad)
	require.Error(t, err, "the status check constraint refuses unknown statuses")

	_, err = triggerstore.GetDelivery(b.ctx, b.pool, "missing")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

// insert stores a delivery the test starts from.
func insert(t *testing.T, b bundle, d triggerstore.Delivery) {
	t.Helper()
	_, err := triggerstore.InsertDelivery(b.ctx, b.pool, d)
	require.NoError(t, err)
}

// retried is a held delivery whose first retry the scheduler was asked
// for.
func retried(id, eventID string, status triggerstore.Status) triggerstore.Delivery {
	d := delivery(id, eventID, status)
	d.RetryState, d.RetryAttempts = triggerstore.RetryScheduled, 1
	return d
}

func launch(t *testing.T, b bundle, id, key string, at time.Time) {
	t.Helper()
	d := delivery(id, "ev-"+id, triggerstore.StatusLaunched)
	d.ThrottleKey, d.RunID, d.LaunchedAt = key, "run-"+id, &at
	inserted, err := triggerstore.InsertDelivery(b.ctx, b.pool, d)
	require.NoError(t, err)
	require.True(t, inserted)
}

func TestNthRecentLaunchSlidingWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	launch(t, b, "L1", "k", now.Add(-50*time.Second))
	launch(t, b, "L2", "k", now.Add(-3*time.Second))
	launch(t, b, "L3", "k", now.Add(-2*time.Second))
	launch(t, b, "L4", "k", now.Add(-1*time.Second))
	launch(t, b, "O1", "other", now.Add(-1*time.Second))
	held := delivery("H1", "ev-H1", triggerstore.StatusThrottled)
	held.ThrottleKey = "k"
	insert(t, b, held)

	since := now.Add(-10 * time.Second)
	at, full, err := triggerstore.NthRecentLaunch(b.ctx, b.pool, "t1", "k", since, 3, "H1")
	require.NoError(t, err)
	require.True(t, full, "three launches of key k in the window, L1 is outside it")
	require.True(t, at.Equal(now.Add(-3*time.Second)), "the 3rd most recent launch frees the next slot, got %s", at)

	_, full, err = triggerstore.NthRecentLaunch(b.ctx, b.pool, "t1", "k", since, 4, "H1")
	require.NoError(t, err)
	require.False(t, full, "throttled deliveries never count, only launches")

	_, full, err = triggerstore.NthRecentLaunch(b.ctx, b.pool, "t1", "k", since, 3, "L4")
	require.NoError(t, err)
	require.False(t, full, "the excluded delivery does not count against itself")

	_, full, err = triggerstore.NthRecentLaunch(b.ctx, b.pool, "t1", "other", since, 1, "H1")
	require.NoError(t, err)
	require.True(t, full, "keys have separate budgets")
}

func TestRunsAndConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	for _, id := range []string{"r1", "r2"} {
		inserted, err := triggerstore.InsertRun(b.ctx, b.pool, triggerstore.Run{ID: id, Workflow: "w", DeliveryID: "d-" + id, TriggerID: "t1", EventID: "e", RequestedAt: now})
		require.NoError(t, err)
		require.True(t, inserted)
	}
	inserted, err := triggerstore.InsertRun(b.ctx, b.pool, triggerstore.Run{ID: "r3", Workflow: "w", DeliveryID: "d-r1", TriggerID: "t1", RequestedAt: now})
	require.NoError(t, err)
	require.False(t, inserted, "one run per delivery")

	n, err := triggerstore.CountInFlight(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	r, changed, err := triggerstore.CompleteRun(b.ctx, b.pool, "r1", "engine-1")
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, triggerstore.RunCompleted, r.Status)
	require.Equal(t, "engine-1", r.Executor)
	require.NotNil(t, r.FinishedAt)
	r, changed, err = triggerstore.FailRun(b.ctx, b.pool, "r1", triggerstore.RunFailure{Attempt: 1, Message: "late"})
	require.NoError(t, err)
	require.False(t, changed, "a finished run stays as it finished")
	require.Equal(t, triggerstore.RunCompleted, r.Status)

	n, err = triggerstore.CountInFlight(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, 1, n)

	_, _, err = triggerstore.CompleteRun(b.ctx, b.pool, "unknown", "")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	_, _, err = triggerstore.EndRun(b.ctx, b.pool, "r2", triggerstore.RunRequested, "", 0, nil)
	require.Error(t, err)
}

// Leases: a run expires when its lease ends, a run launched before
// leases existed (NULL lease) at requested_at plus the default, and a
// lease extension uses the trigger's own run timeout, capped by when the
// heartbeat was sent.
func TestRunLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def := definition()
	def.RunTimeout = 10 * time.Minute
	_, err := triggerstore.CreateTrigger(b.ctx, b.pool, "t1", def)
	require.NoError(t, err)
	now, err := triggerstore.Now(b.ctx, b.pool)
	require.NoError(t, err)
	ended, later := now.Add(-time.Second), now.Add(time.Hour)
	for _, r := range []triggerstore.Run{
		{ID: "ended", LeaseExpiresAt: &ended, RequestedAt: now.Add(-time.Minute)},
		{ID: "leased", LeaseExpiresAt: &later, RequestedAt: now.Add(-2 * time.Hour)},
		{ID: "legacy-old", RequestedAt: now.Add(-2 * time.Hour)},
		{ID: "legacy-new", RequestedAt: now.Add(-time.Minute)},
	} {
		r.Workflow, r.DeliveryID, r.TriggerID = "w", "d-"+r.ID, "t1"
		_, err := triggerstore.InsertRun(b.ctx, b.pool, r)
		require.NoError(t, err)
	}
	expired, err := triggerstore.ExpireRuns(b.ctx, b.pool, now, time.Hour, 10)
	require.NoError(t, err)
	var ids []string
	for _, r := range expired {
		ids = append(ids, r.ID)
		require.Equal(t, triggerstore.RunRetrying, r.Status, "an attempt that timed out is retried")
		require.Equal(t, triggerstore.RunTimeoutReason, r.Error)
		require.Equal(t, "timeout", r.LastErrorClass)
	}
	require.Equal(t, []string{"legacy-old", "ended"}, ids, "earliest lease first")

	r, extended, err := triggerstore.ExtendLease(b.ctx, b.pool, "legacy-new", now.Add(time.Hour), time.Hour)
	require.NoError(t, err)
	require.True(t, extended)
	require.WithinDuration(t, now.Add(10*time.Minute), *r.LeaseExpiresAt, 5*time.Second,
		"the trigger's own timeout from the database's now, not from a future send time")
	_, extended, err = triggerstore.ExtendLease(b.ctx, b.pool, "ended", now, time.Hour)
	require.NoError(t, err)
	require.False(t, extended, "a finished run keeps no lease")
	_, _, err = triggerstore.ExtendLease(b.ctx, b.pool, "unknown", now, time.Hour)
	require.ErrorIs(t, err, pgdb.ErrNotFound)

	got, err := triggerstore.GetTrigger(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, got.RunTimeout)
}

func TestRetryStateGuards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, retried("H1", "e1", triggerstore.StatusThrottled))

	next := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	applied, err := triggerstore.ApplyScheduled(b.ctx, b.pool, "H1", 2, next, false, map[string]any{"policy": "event-trigger"})
	require.NoError(t, err)
	require.True(t, applied)
	got, err := triggerstore.GetDelivery(b.ctx, b.pool, "H1")
	require.NoError(t, err)
	require.Equal(t, 2, got.ScheduledAttempt)
	require.True(t, got.NextAttemptAt.Equal(next))
	require.Equal(t, "event-trigger", got.RetryMetadata["policy"])

	// Attempt 2 was held again: the delivery now knows attempt 2 failed.
	got.RetryAttempts = 2
	require.NoError(t, triggerstore.SaveOutcome(b.ctx, b.pool, got))
	applied, err = triggerstore.ApplyScheduled(b.ctx, b.pool, "H1", 2, next, false, nil)
	require.NoError(t, err)
	require.False(t, applied, "a scheduled event older than the delivery's state is ignored")

	_, applied, err = triggerstore.ApplyExhausted(b.ctx, b.pool, "H1", 1, "max_retries", nil)
	require.NoError(t, err)
	require.False(t, applied, "a stale exhausted is ignored")
	d, applied, err := triggerstore.ApplyExhausted(b.ctx, b.pool, "H1", 2, "max_retries", map[string]any{"exhausted_reason": "max_retries"})
	require.NoError(t, err)
	require.True(t, applied)
	require.Equal(t, triggerstore.StatusExhausted, d.Status)
	require.Equal(t, triggerstore.RetryExhausted, d.RetryState)
	require.Equal(t, "max_retries", d.StatusReason)
	require.Nil(t, d.NextAttemptAt)
	require.Equal(t, "event-trigger", d.RetryMetadata["policy"], "metadata is merged")

	// Only a manual retry reopens an exhausted delivery.
	applied, err = triggerstore.ApplyScheduled(b.ctx, b.pool, "H1", 3, next, false, nil)
	require.NoError(t, err)
	require.False(t, applied, "a scheduled event that is not a manual retry")
	applied, err = triggerstore.ApplyScheduled(b.ctx, b.pool, "H1", 3, next, true, nil)
	require.NoError(t, err)
	require.True(t, applied)
	got, err = triggerstore.GetDelivery(b.ctx, b.pool, "H1")
	require.NoError(t, err)
	require.Equal(t, 3, got.ScheduledAttempt)
	require.Equal(t, triggerstore.RetryScheduled, got.RetryState)

	launched := delivery("L1", "e2", triggerstore.StatusLaunched)
	launched.RunID = "run-L1"
	insert(t, b, launched)
	d, applied, err = triggerstore.ApplyCancelled(b.ctx, b.pool, "L1", 0, "cancelled_by_operator", nil)
	require.NoError(t, err)
	require.False(t, applied, "a launched delivery is never cancelled")
	require.Equal(t, triggerstore.StatusLaunched, d.Status)

	_, _, err = triggerstore.ApplyCancelled(b.ctx, b.pool, "missing", 0, "x", nil)
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

func TestUnconfirmedAndListing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, retried("H1", "e1", triggerstore.StatusConcurrencyLimited))
	insert(t, b, retried("H2", "e2", triggerstore.StatusThrottled))
	_, err := triggerstore.ApplyScheduled(b.ctx, b.pool, "H2", 2, time.Now(), false, nil)
	require.NoError(t, err)

	list, err := triggerstore.Unconfirmed(b.ctx, b.pool, time.Now().Add(time.Second), 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "H1", list[0].ID)
	list, err = triggerstore.Unconfirmed(b.ctx, b.pool, time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.Empty(t, list, "recent deliveries are left to the normal path")

	page, err := triggerstore.ListDeliveries(b.ctx, b.pool, triggerstore.ListDeliveriesOptions{TriggerID: "t1", Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	rest, err := triggerstore.ListDeliveries(b.ctx, b.pool, triggerstore.ListDeliveriesOptions{TriggerID: "t1", Before: page[0].ID})
	require.NoError(t, err)
	require.Len(t, rest, 1)
	require.NotEqual(t, page[0].ID, rest[0].ID)
	throttled, err := triggerstore.ListDeliveries(b.ctx, b.pool, triggerstore.ListDeliveriesOptions{TriggerID: "t1", Status: triggerstore.StatusThrottled})
	require.NoError(t, err)
	require.Len(t, throttled, 1)

	counts, err := triggerstore.CountByStatus(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, map[triggerstore.Status]int{triggerstore.StatusThrottled: 1, triggerstore.StatusConcurrencyLimited: 1}, counts)
}

func TestNowIsDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now, err := triggerstore.Now(b.ctx, b.pool)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), now, time.Minute)
}

// Triggers keeps the event of a held delivery once, and prunes it only
// when none of the event's deliveries is held, exhausted or cancelled any
// more and it is older than the grace.
func TestKeptEventsLiveWhileADeliveryNeedsThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, delivery("DH", "e-held", triggerstore.StatusThrottled))
	insert(t, b, delivery("DL", "e-done", triggerstore.StatusLaunched))
	for _, id := range []string{"e-held", "e-done"} {
		require.NoError(t, triggerstore.KeepEvent(b.ctx, b.pool, id, json.RawMessage(`{"id":"`+id+`","v":1}`)))
		require.NoError(t, triggerstore.KeepEvent(b.ctx, b.pool, id, json.RawMessage(`{"id":"`+id+`","v":2}`)))
	}
	got, err := triggerstore.GetEvent(b.ctx, b.pool, "e-held")
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"e-held","v":1}`, string(got), "kept once: the first copy stays")

	n, err := triggerstore.PruneEvents(b.ctx, b.pool, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "younger than the grace")
	n, err = triggerstore.PruneEvents(b.ctx, b.pool, -time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only the event whose delivery launched")
	_, err = triggerstore.GetEvent(b.ctx, b.pool, "e-done")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	_, err = triggerstore.GetEvent(b.ctx, b.pool, "e-held")
	require.NoError(t, err)
}

// The throttle line: launches in the window and slots given out form one
// sequence; the next slot is when the limit-th latest of them leaves the
// window, after the last slot, never before now.
func TestThrottleSlotLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	const window, limit = 10 * time.Second, 2
	hold := func(id string, slot time.Time) {
		t.Helper()
		d := delivery(id, "ev-"+id, triggerstore.StatusThrottled)
		d.ThrottleKey, d.NextAttemptAt = "k", &slot
		insert(t, b, d)
	}
	slot, waiting, err := triggerstore.ThrottleSlot(b.ctx, b.pool, "t1", "k", now, window, limit, "new")
	require.NoError(t, err)
	require.False(t, waiting)
	require.True(t, slot.Equal(now), "nothing in the window: now, got %s", slot)

	launch(t, b, "L1", "k", now.Add(-4*time.Second))
	launch(t, b, "L2", "k", now.Add(-1*time.Second))
	slot, waiting, err = triggerstore.ThrottleSlot(b.ctx, b.pool, "t1", "k", now, window, limit, "new")
	require.NoError(t, err)
	require.False(t, waiting)
	require.True(t, slot.Equal(now.Add(6*time.Second)), "L1 leaves the window first: got %s", slot)

	hold("H1", now.Add(6*time.Second))
	slot, waiting, err = triggerstore.ThrottleSlot(b.ctx, b.pool, "t1", "k", now, window, limit, "new")
	require.NoError(t, err)
	require.True(t, waiting, "H1 waits in line")
	require.True(t, slot.Equal(now.Add(9*time.Second)), "then L2 leaves it: got %s", slot)

	hold("H2", now.Add(9*time.Second))
	slot, _, err = triggerstore.ThrottleSlot(b.ctx, b.pool, "t1", "k", now, window, limit, "new")
	require.NoError(t, err)
	require.True(t, slot.Equal(now.Add(16*time.Second)), "then H1's own launch, a window after its slot: got %s", slot)

	slot, _, err = triggerstore.ThrottleSlot(b.ctx, b.pool, "t1", "k", now, window, limit, "H2")
	require.NoError(t, err)
	require.True(t, slot.Equal(now.Add(9*time.Second)), "H2 deciding again is not behind itself: got %s", slot)

	hold("H3", now.Add(16*time.Second))
	hold("H4", now.Add(16*time.Second))
	slot, _, err = triggerstore.ThrottleSlot(b.ctx, b.pool, "t1", "k", now, window, 5, "new")
	require.NoError(t, err)
	require.True(t, slot.Equal(now.Add(16*time.Second+time.Microsecond)), "strictly after the last slot: got %s", slot)

	n, err := triggerstore.ThrottleHoldersAhead(b.ctx, b.pool, "t1", "k", "H2", now.Add(-time.Minute), now.Add(20*time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n, "H1 is ahead of H2")
}

// A run's retry path in the store: steps make the checkpoint, a failure
// of the attempt in flight moves it to retrying (a stale one does not),
// it keeps its slot, a relaunch is applied once per attempt, a step of
// an attempt is recorded once, and the scheduler's exhaustion ends it.
func TestRunRetryPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	inserted, err := triggerstore.InsertRun(ctx, b.pool, triggerstore.Run{ID: "r1", Workflow: "w", DeliveryID: "d-r1", TriggerID: "t1", EventID: "e", RequestedAt: time.Now()})
	require.NoError(t, err)
	require.True(t, inserted)

	step := func(attempt int, node, status string, out string) bool {
		t.Helper()
		d := contract.RunStepData{RunID: "r1", Workflow: "w", Attempt: attempt, Node: node, Status: status, Executor: "engine-1"}
		if status == contract.StepCompleted {
			d.Output = json.RawMessage(out)
		} else {
			d.Error = &contract.ErrorInfo{Class: "network", Message: out}
		}
		var recorded bool
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			_, recorded, err = triggerstore.RecordStep(ctx, tx, d, time.Now())
			return err
		}))
		return recorded
	}
	require.True(t, step(1, "fetch", contract.StepCompleted, `{"n":1}`))
	require.False(t, step(1, "fetch", contract.StepCompleted, `{"n":1}`), "one report per node and attempt")
	require.True(t, step(1, "enrich", contract.StepFailed, "reset"))
	r, err := triggerstore.GetRun(ctx, b.pool, "r1")
	require.NoError(t, err)
	require.Equal(t, triggerstore.RunInProgress, r.Status)
	require.Equal(t, "enrich", r.CurrentNodeID)

	_, changed, err := triggerstore.FailRun(ctx, b.pool, "r1", triggerstore.RunFailure{Attempt: 2, Class: "network", Message: "reset"})
	require.NoError(t, err)
	require.False(t, changed, "attempt 2 is not in flight")
	r, changed, err = triggerstore.FailRun(ctx, b.pool, "r1", triggerstore.RunFailure{Attempt: 1, Class: "network", Message: "reset", Node: "enrich"})
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, triggerstore.RunRetrying, r.Status)
	require.Equal(t, "network", r.LastErrorClass)
	require.True(t, r.Retried())
	n, err := triggerstore.CountInFlight(ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, 1, n, "a retrying run keeps its slot")

	cp, err := triggerstore.Checkpoint(ctx, b.pool, "r1")
	require.NoError(t, err)
	require.Equal(t, &contract.RunCheckpoint{Node: "fetch", Outputs: map[string]json.RawMessage{"fetch": json.RawMessage(`{"n": 1}`)}}, cp)

	next := time.Now().Add(time.Second).UTC().Truncate(time.Microsecond)
	three := 3
	ok, err := triggerstore.ScheduleRunRetry(ctx, b.pool, "r1", 1, next, 1, &three, map[string]any{"policy": "workflow_run"})
	require.NoError(t, err)
	require.True(t, ok)
	steps, err := triggerstore.Steps(ctx, b.pool, "r1")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, "scheduled", steps[1].RetryState)
	require.Equal(t, 1, steps[1].RetryAttempts)

	relaunch := func(attempt int) (triggerstore.Run, bool) {
		var r triggerstore.Run
		var changed bool
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			r, changed, _, err = triggerstore.RelaunchRun(ctx, tx, "r1", attempt, time.Minute)
			return err
		}))
		return r, changed
	}
	r, changed = relaunch(2)
	require.True(t, changed)
	require.Equal(t, triggerstore.RunRequested, r.Status)
	require.Equal(t, 2, r.Attempt)
	require.NotNil(t, r.LeaseExpiresAt)
	_, changed = relaunch(2)
	require.False(t, changed, "a due delivered twice launches once")

	require.True(t, step(2, "enrich", contract.StepFailed, "reset again"))
	_, changed, err = triggerstore.FailRun(ctx, b.pool, "r1", triggerstore.RunFailure{Attempt: 2, Class: "network", Message: "reset again"})
	require.NoError(t, err)
	require.True(t, changed)
	r, changed, err = triggerstore.EndRun(ctx, b.pool, "r1", triggerstore.RunFailedMaxRetries, "exhausted: max_retries", 3, &three)
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, triggerstore.RunFailedMaxRetries, r.Status)
	require.Equal(t, 3, r.RetryCount)
	steps, err = triggerstore.Steps(ctx, b.pool, "r1")
	require.NoError(t, err)
	require.Equal(t, "exhausted", steps[1].RetryState)
	require.Equal(t, 2, steps[1].Attempts)
	n, err = triggerstore.CountInFlight(ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Zero(t, n)

	// A step of a run retryd did not launch.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := triggerstore.RecordStep(ctx, tx, contract.RunStepData{RunID: "nope", Workflow: "w", Node: "a", Status: contract.StepCompleted}, time.Now())
		require.ErrorIs(t, err, pgdb.ErrNotFound)
		return nil
	}))
}

// An operator's retry of a run that ended takes a slot like a new run:
// with the trigger's max concurrency in flight it is refused as full and
// nothing changes; once a slot is free it launches.
func TestRelaunchOfAnEndedRunWaitsForASlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	_, err := triggerstore.CreateTrigger(ctx, b.pool, "t1", definition()) // max concurrency 2
	require.NoError(t, err)
	for _, id := range []string{"ended", "a", "b"} {
		_, err := triggerstore.InsertRun(ctx, b.pool, triggerstore.Run{ID: id, Workflow: "onboard", DeliveryID: "d-" + id, TriggerID: "t1", RequestedAt: time.Now()})
		require.NoError(t, err)
	}
	_, _, err = triggerstore.FailRun(ctx, b.pool, "ended", triggerstore.RunFailure{Attempt: 1, Class: "validation", Message: "bad"})
	require.NoError(t, err)
	_, changed, err := triggerstore.EndRun(ctx, b.pool, "ended", triggerstore.RunFailed, "exhausted: non_retryable", 0, nil)
	require.NoError(t, err)
	require.True(t, changed)

	relaunch := func() (triggerstore.Run, bool, bool) {
		var r triggerstore.Run
		var changed, full bool
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			r, changed, full, err = triggerstore.RelaunchRun(ctx, tx, "ended", 2, time.Minute)
			return err
		}))
		return r, changed, full
	}
	r, changed, full := relaunch()
	require.True(t, full, "a and b hold both slots")
	require.False(t, changed)
	require.Equal(t, triggerstore.RunFailed, r.Status)

	_, _, err = triggerstore.CompleteRun(ctx, b.pool, "a", "")
	require.NoError(t, err)
	r, changed, full = relaunch()
	require.False(t, full)
	require.True(t, changed)
	require.Equal(t, triggerstore.RunRequested, r.Status)
	require.Equal(t, 2, r.Attempt)
	require.Nil(t, r.FinishedAt)
}

// The scheduler's end of a run applies to a retrying run only: a cancel
// that arrives while an attempt is in flight frees no slot the attempt
// still uses.
func TestEndRunOnlyEndsARetryingRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := triggerstore.InsertRun(b.ctx, b.pool, triggerstore.Run{ID: "r1", Workflow: "w", DeliveryID: "d-r1", TriggerID: "t1", RequestedAt: time.Now()})
	require.NoError(t, err)
	r, changed, err := triggerstore.EndRun(b.ctx, b.pool, "r1", triggerstore.RunFailed, "cancelled by alice", 0, nil)
	require.NoError(t, err)
	require.False(t, changed)
	require.Equal(t, triggerstore.RunRequested, r.Status)
	n, err := triggerstore.CountInFlight(b.ctx, b.pool, "t1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// A node's retries are counted once each, whatever the order in which
// its reports, the scheduler's decisions and the next attempts' launches
// are applied (they come from different streams, handled concurrently),
// and a report or decision delivered again counts nothing.
func TestStepRetriesCountedInAnyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	three := 3
	type op func(t *testing.T, id string)
	report := func(attempt int, status string, recorded bool) op {
		return func(t *testing.T, id string) {
			t.Helper()
			d := contract.RunStepData{RunID: id, Workflow: "w", Attempt: attempt, Node: "enrich", Status: status, Executor: "engine-1"}
			if status == contract.StepFailed {
				d.Error = &contract.ErrorInfo{Class: "network", Message: "reset"}
			} else {
				d.Output = json.RawMessage(`{}`)
			}
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, got, err := triggerstore.RecordStep(ctx, tx, d, time.Now())
				require.Equal(t, recorded, got, "%s report of attempt %d recorded", status, attempt)
				return err
			}))
		}
	}
	fail := func(attempt int) op {
		return func(t *testing.T, id string) {
			t.Helper()
			_, changed, err := triggerstore.FailRun(ctx, b.pool, id, triggerstore.RunFailure{Attempt: attempt, Class: "network", Message: "reset"})
			require.NoError(t, err)
			require.True(t, changed)
		}
	}
	decide := func(attempt int, applied bool) op {
		return func(t *testing.T, id string) {
			t.Helper()
			ok, err := triggerstore.ScheduleRunRetry(ctx, b.pool, id, attempt, time.Now().Add(time.Second), attempt, &three, map[string]any{"policy": "workflow_run"})
			require.NoError(t, err)
			require.Equal(t, applied, ok)
		}
	}
	launch := func(attempt int) op {
		return func(t *testing.T, id string) {
			t.Helper()
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, changed, _, err := triggerstore.RelaunchRun(ctx, tx, id, attempt, time.Minute)
				require.True(t, changed)
				return err
			}))
		}
	}
	// Attempt 1 failed in order and was retried: one retry counted.
	first := []op{report(1, contract.StepFailed, true), fail(1), decide(1, true), launch(2)}
	for _, c := range []struct {
		name     string
		ops      []op
		status   string
		state    string
		attempts int
	}{
		{"failed report after the next attempt launched",
			[]op{fail(2), decide(2, true), launch(3), report(2, contract.StepFailed, true), report(2, contract.StepFailed, false)},
			contract.StepFailed, "scheduled", 2},
		{"failed report after the next attempt's completed report",
			[]op{fail(2), decide(2, true), launch(3), report(3, contract.StepCompleted, true),
				report(2, contract.StepFailed, true), report(2, contract.StepFailed, false)},
			contract.StepCompleted, "succeeded", 3},
		{"decision after the next attempt launched",
			[]op{report(2, contract.StepFailed, true), fail(2), launch(3), decide(2, false)},
			contract.StepFailed, "scheduled", 2},
		{"report after the decision, then the decision rescheduled and the report delivered again",
			[]op{fail(2), decide(2, true), report(2, contract.StepFailed, true), decide(2, true),
				report(2, contract.StepFailed, false), launch(3), report(3, contract.StepCompleted, true)},
			contract.StepCompleted, "succeeded", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := "r-" + c.name
			_, err := triggerstore.InsertRun(ctx, b.pool, triggerstore.Run{ID: id, Workflow: "w", DeliveryID: "d-" + id, TriggerID: "t1", RequestedAt: time.Now()})
			require.NoError(t, err)
			for _, o := range append(append([]op{}, first...), c.ops...) {
				o(t, id)
			}
			steps, err := triggerstore.Steps(ctx, b.pool, id)
			require.NoError(t, err)
			require.Len(t, steps, 1)
			s := steps[0]
			require.Equal(t, 2, s.RetryAttempts, "attempts 1 and 2 were retried")
			require.Equal(t, c.status, s.Status)
			require.Equal(t, c.state, s.RetryState)
			require.Equal(t, c.attempts, s.Attempts)
		})
	}
}
