package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// snapshot renders the projection as JSON text: every column of every row
// but the bookkeeping timestamps, and each item's history in fact order.
func snapshot(t *testing.T, pool *pgxpool.Pool) (rows, history []string) {
	t.Helper()
	return pgtest.Strings(t, pool, `SELECT (to_jsonb(r) - 'created_at' - 'updated_at')::text FROM retries r ORDER BY kind, item_id`),
		pgtest.Strings(t, pool, `SELECT (to_jsonb(h) - 'id')::text FROM retry_history h ORDER BY kind, item_id, at, attempt, event`)
}

// The projection rebuilt from RETRIES into an empty database equals the
// original after a mixed workload: successes, exhaustion, non-retryable
// classes, cancellations before and after due, manual retries with and
// without reset, owner cancellations, overrides, duplicates, pending and
// due items.
func TestRebuildEqualsOriginal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	shrinkDuplicateWindow(t, b, time.Second)
	b.policy(t, "rb", "", 3, 10, 10)
	b.policy(t, "rb-slow", "", 3, hourMS, hourMS)
	zero := 0

	// Successes after one, two and three failures.
	for i := range 30 {
		id := fmt.Sprintf("s%02d", i)
		fails := 1 + i%3
		for a := 1; a <= fails; a++ {
			fd := failed("rb", id, a, "network")
			fd.Checkpoint = []byte(fmt.Sprintf(`{"step":%d}`, a))
			if i%2 == 0 { // the others come from workers that name no executor
				fd.Executor = fmt.Sprintf("worker-%d", a)
			}
			b.publish(t, contract.Failed, fd)
			b.waitRow(t, "rb", id, inState(retrystore.StateDue, a+1))
		}
		b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "rb", ID: id, Attempt: fails + 1, Executor: "worker-ok"})
	}
	// Exhausted by budget, by class, by a job-level override.
	for a := 1; a <= 4; a++ {
		b.publish(t, contract.Failed, failed("rb", "e1", a, "timeout"))
		if a < 4 {
			b.waitRow(t, "rb", "e1", inState(retrystore.StateDue, a+1))
		}
	}
	b.publish(t, contract.Failed, failed("rb", "v1", 1, "permission"))
	j1 := failed("rb", "j1", 1, "timeout")
	j1.MaxRetries = &zero
	j1.JobType = "export"
	b.publish(t, contract.Failed, j1)
	// Cancelled while waiting, and after due (the owner's late failure is
	// stale).
	b.failTo(t, "rb-slow", "c1", 1, "timeout", retrystore.StateScheduled)
	_, err := s.Cancel(b.ctx, "rb-slow", "c1", "ops", "not needed")
	require.NoError(t, err)
	b.failTo(t, "rb", "c2", 1, "timeout", retrystore.StateDue)
	_, err = s.Cancel(b.ctx, "rb", "c2", "ops", "")
	require.NoError(t, err)
	b.publish(t, contract.Failed, failed("rb", "c2", 2, "timeout"))
	// The owner cancels an item that never failed.
	b.publish(t, contract.Cancelled, contract.CancelledData{Kind: "rb", ID: "o1", By: "owner", Reason: "gone"})
	// Manual retries: of an exhausted item with reset, of a waiting one.
	b.publish(t, contract.Failed, failed("rb", "m1", 1, "validation"))
	b.waitRow(t, "rb", "m1", inState(retrystore.StateExhausted, 1))
	_, err = s.RetryNow(b.ctx, "rb", "m1", scheduler.RetryNowOptions{ResetAttempts: true, Reason: "data fixed"})
	require.NoError(t, err)
	b.waitRow(t, "rb", "m1", inState(retrystore.StateDue, 2))
	b.failTo(t, "rb-slow", "m2", 1, "timeout", retrystore.StateScheduled)
	_, err = s.RetryNow(b.ctx, "rb-slow", "m2", scheduler.RetryNowOptions{By: "ops"})
	require.NoError(t, err)
	// A duplicate stored past the duplicate window, a throttled failure
	// still waiting, an item waiting for its owner after due.
	dup := lifecycleMsg(t, contract.Failed, failed("rb-slow", "dup", 1, "timeout"))
	_, err = b.js.PublishMsg(b.ctx, dup)
	require.NoError(t, err)
	b.storeAgain(t, dup)
	b.publish(t, contract.Failed, contract.FailedData{Kind: "rb-slow", ID: "th", Attempt: 1, Reason: "source_throttled",
		Error: contract.ErrorInfo{Class: "rate_limit", Message: "slow down"}, RetryAfter: contract.RetryAfterDuration(20 * time.Minute),
		Payload: []byte(`{"event":"e1"}`), Metadata: map[string]string{"source": "crm"}, Executor: "Ingress 0"})
	b.publish(t, contract.Failed, failed("rb", "d1", 1, "timeout"))

	b.waitRow(t, "rb", "e1", inState(retrystore.StateExhausted, 4))
	b.waitRow(t, "rb", "d1", inState(retrystore.StateDue, 2))
	b.waitRow(t, "rb-slow", "m2", inState(retrystore.StateDue, 3))
	b.waitRow(t, "rb-slow", "th", inState(retrystore.StateScheduled, 2))
	b.waitRow(t, "rb", "s29", inState(retrystore.StateSucceeded, 4))
	b.waitQuiet(t)
	b.stop(t, s)
	wantRows, wantHistory := snapshot(t, b.pool)
	require.Len(t, wantRows, 30+11)
	// The executors are in the history the rebuild must reproduce.
	require.Equal(t, []string{"worker-1", "", "", "worker-ok"}, executors(b.history(t, "rb", "s00")))
	require.Equal(t, "Ingress 0", b.history(t, "rb-slow", "th")[0].Executor, "a legacy hold keeps its executor")

	_, err = scheduler.Rebuild(b.ctx, b.js, b.pool, servicetest.Logger(t))
	require.ErrorIs(t, err, scheduler.ErrNotEmpty)

	fresh := pgtest.NewPool(t)
	stats, err := scheduler.Rebuild(b.ctx, b.js, fresh, servicetest.Logger(t))
	require.NoError(t, err)
	require.Zero(t, stats.Decided)
	require.Zero(t, stats.Malformed)
	require.Equal(t, int64(len(wantRows)), stats.Retries)
	require.Positive(t, stats.Stale, "the late failure of c2 and the cancelled event of the API are stale or duplicates")
	gotRows, gotHistory := snapshot(t, fresh)
	require.Equal(t, wantRows, gotRows)
	require.Equal(t, wantHistory, gotHistory)

	// The rebuilt projection is live: the waiting retries come due from it.
	_, err = fresh.Exec(b.ctx, `UPDATE retries SET next_attempt_at = now() WHERE kind = 'rb-slow' AND item_id = 'th'`)
	require.NoError(t, err)
	b2 := *b
	b2.pool = fresh
	b2.start(t)
	b2.waitRow(t, "rb-slow", "th", inState(retrystore.StateDue, 2))
}

// A failure the scheduler never decided (its database was lost with the
// decision) is decided by the rebuild and its event published.
func TestRebuildDecidesMissingDecisions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A scheduler creates the streams, then goes away.
	s := b.start(t)
	b.stop(t, s)
	b.publish(t, contract.Failed, failed("event", "lost", 1, "timeout"))
	b.publish(t, contract.Failed, failed("event", "lost-nr", 1, "authentication"))

	stats, err := scheduler.Rebuild(b.ctx, b.js, b.pool, servicetest.Logger(t))
	require.NoError(t, err)
	require.Equal(t, 2, stats.Decided)
	row, err := retrystore.Get(b.ctx, b.pool, "event", "lost")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, row.State)
	require.Equal(t, 2, row.Attempt)
	require.Equal(t, "event-ingress", row.PolicyName)
	row, err = retrystore.Get(b.ctx, b.pool, "event", "lost-nr")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateExhausted, row.State)
	require.Len(t, b.streamMsgs(t, "retry.event.scheduled.lost"), 1)
	require.Len(t, b.streamMsgs(t, "retry.event.exhausted.lost-nr"), 1)

	// The live consumer sees the failures as already applied.
	c := b.start(t)
	waitMetric(t, c.reg, 2, "retryd_scheduler_duplicate_total", "consumer", "scheduler")
	require.Equal(t, []string{"failed:1", "scheduled:2"}, events(b.history(t, "event", "lost")))
}

// An owner's failure that reached the stream before an operator's cancel
// or manual retry, but was applied after it (and found stale), is not
// applied by the rebuild either.
func TestRebuildOperatorActionOvertakingAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	require.NoError(t, s.Stop(b.ctx))

	at := time.Now().UTC().Truncate(time.Millisecond)
	next := at.Add(time.Second)
	schedMsg := func(ev contract.Lifecycle, id string, attempt int, decidedBy string, retryCount int) {
		msg, err := contract.NewLifecycleMsg("retryd/scheduler", ev, contract.ScheduledData{
			Kind: "job", ID: id, Attempt: attempt, NextAttemptAt: next,
			Decision: contract.Decision{Policy: "job-default", PolicyVersion: 1, DecidedBy: decidedBy, ErrorClass: "timeout", RetryCount: retryCount, MaxRetries: 5},
		}, at)
		require.NoError(t, err)
		_, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	due := func(id string, attempt int) {
		msg, err := contract.NewLifecycleMsg("retryd/scheduler", contract.Due, contract.DueData{Kind: "job", ID: id, Attempt: attempt, NextAttemptAt: next}, next)
		require.NoError(t, err)
		_, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	for _, id := range []string{"cancelled", "manual"} {
		b.publish(t, contract.Failed, failed("job", id, 1, "timeout"))
		schedMsg(contract.Scheduled, id, 2, contract.DecidedByBackoff, 1)
		due(id, 2)
		// The owner reports attempt 2 failed while the operator's event
		// sits in the outbox.
		b.publish(t, contract.Failed, failed("job", id, 2, "timeout"))
	}
	cancel, err := contract.NewLifecycleMsg("retryd/scheduler", contract.Cancelled, contract.CancelledData{Kind: "job", ID: "cancelled", Attempt: 2, By: "ops"}, next)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, cancel)
	require.NoError(t, err)
	schedMsg(contract.Rescheduled, "manual", 3, contract.DecidedByManual, 2)

	stats, err := scheduler.Rebuild(b.ctx, b.js, b.pool, servicetest.Logger(t))
	require.NoError(t, err)
	require.Zero(t, stats.Decided)
	require.Equal(t, 2, stats.Stale)
	row, err := retrystore.Get(b.ctx, b.pool, "job", "cancelled")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateCancelled, row.State)
	require.Equal(t, 2, row.Attempt)
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "cancelled:2"}, events(b.history(t, "job", "cancelled")))
	row, err = retrystore.Get(b.ctx, b.pool, "job", "manual")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, row.State)
	require.Equal(t, 3, row.Attempt)
	require.Zero(t, row.DueEmissions)
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "rescheduled:3"}, events(b.history(t, "job", "manual")))
}

// A decision the relay published after the due loop had published its
// due (the due loop's flush skips outbox rows the relay holds), and after
// the owner had answered that due: the live scheduler applied the
// decision before the due, so the rebuild applies it too, late, and keeps
// what the due and the answer did. Issue 39: TestRebuildEqualsOriginal
// rebuilt a success with the retry_count of the attempt before.
func TestRebuildDecisionAfterItsAttemptsOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	require.NoError(t, s.Stop(b.ctx))

	t0 := time.Now().UTC().Truncate(time.Millisecond)
	decidedAt, next := t0.Add(time.Millisecond), t0.Add(10*time.Millisecond)
	pub := func(source string, ev contract.Lifecycle, data any, at time.Time) {
		_, err := b.js.PublishMsg(b.ctx, contracttest.LifecycleMsg(t, source, ev, data, at))
		require.NoError(t, err)
	}
	owner := func(ev contract.Lifecycle, data any, at time.Time) { pub("test/owner", ev, data, at) }
	decision := func(id string, attempt, retryCount int, at time.Time) {
		pub("retryd/scheduler", contract.Scheduled, contract.ScheduledData{Kind: "job", ID: id, Attempt: attempt, NextAttemptAt: at.Add(9 * time.Millisecond),
			Decision: contract.Decision{Policy: "job-default", PolicyVersion: 1, DecidedBy: contract.DecidedByBackoff, ErrorClass: "timeout",
				RetryCount: retryCount, MaxRetries: 5, DelayMS: 9}}, at)
	}
	due := func(id string, attempt int, at time.Time) {
		pub("retryd/scheduler", contract.Due, contract.DueData{Kind: "job", ID: id, Attempt: attempt, NextAttemptAt: at}, at)
	}
	failedAt := func(id string, attempt int, at time.Time) {
		f := failed("job", id, attempt, "timeout")
		owner(contract.Failed, f, at)
	}

	// Stream order: failed:1, due:2, the outcome of attempt 2, scheduled:2.
	failedAt("succeeded", 1, t0)
	due("succeeded", 2, next)
	owner(contract.Succeeded, contract.SucceededData{Kind: "job", ID: "succeeded", Attempt: 2}, next.Add(time.Millisecond))
	decision("succeeded", 2, 1, decidedAt)

	failedAt("cancelled", 1, t0)
	due("cancelled", 2, next)
	owner(contract.Cancelled, contract.CancelledData{Kind: "job", ID: "cancelled", Attempt: 2, By: "owner", Reason: "gone"}, next.Add(time.Millisecond))
	decision("cancelled", 2, 1, decidedAt)

	// Attempt 2 failed too before the decision that scheduled it arrived;
	// the decision of that failure follows in order.
	failedAt("again", 1, t0)
	due("again", 2, next)
	failedAt("again", 2, next.Add(time.Millisecond))
	decision("again", 2, 1, decidedAt)
	decision("again", 3, 2, next.Add(2*time.Millisecond))

	fresh := pgtest.NewPool(t)
	stats, err := scheduler.Rebuild(b.ctx, b.js, fresh, servicetest.Logger(t))
	require.NoError(t, err)
	require.Zero(t, stats.Decided)
	require.Zero(t, stats.Stale)

	check := func(id string, state retrystore.State, attempt, retryCount int, history ...string) {
		t.Helper()
		row, err := retrystore.Get(b.ctx, fresh, "job", id)
		require.NoError(t, err)
		require.Equal(t, state, row.State, id)
		require.Equal(t, attempt, row.Attempt, id)
		require.Equal(t, retryCount, row.RetryCount, id)
		require.Equal(t, attempt-1-retryCount, row.BudgetBase, id)
		require.Equal(t, "job-default", row.PolicyName, id)
		require.Equal(t, 5, row.MaxRetries, id)
		require.Equal(t, history, pgtest.Strings(t, fresh, `SELECT event || ':' || attempt FROM retry_history
WHERE kind = 'job' AND item_id = $1 ORDER BY at, attempt, event`, id), id)
	}
	check("succeeded", retrystore.StateSucceeded, 2, 1, "failed:1", "scheduled:2", "due:2", "succeeded:2")
	row, err := retrystore.Get(b.ctx, fresh, "job", "succeeded")
	require.NoError(t, err)
	require.Equal(t, 1, row.DueEmissions, "the due's emission is kept")
	require.NotNil(t, row.ResolvedAt)
	check("cancelled", retrystore.StateCancelled, 2, 1, "failed:1", "scheduled:2", "due:2", "cancelled:2")
	check("again", retrystore.StateScheduled, 3, 2, "failed:1", "scheduled:2", "due:2", "failed:2", "scheduled:3")
}
