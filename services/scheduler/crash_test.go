package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

var errCrash = errors.New("simulated crash")

// A failed delivered twice, or republished with the same id after the
// duplicate window (a new stream sequence, no Nats-Msg-Id dedup), changes
// nothing the second time: the inbox catches it.
func TestDuplicateFailedChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	shrinkDuplicateWindow(t, b, time.Second)
	b.policy(t, "dup", "", 3, hourMS, hourMS)

	msg := lifecycleMsg(t, contract.Failed, failed("dup", "d1", 1, "timeout"))
	// Past the window the same fact is stored again.
	first, third := b.storeTwice(t, msg)
	require.Greater(t, third.Sequence, first.Sequence)

	waitMetric(t, s.reg, 1, "retryd_scheduler_duplicate_total", "consumer", "scheduler")
	row := b.waitRow(t, "dup", "d1", inState(retrystore.StateScheduled, 2))
	require.Equal(t, []string{"failed:1", "scheduled:2"}, events(b.history(t, "dup", "d1")))
	require.Equal(t, 1, row.RetryCount)
	require.Eventually(t, func() bool { return len(b.streamMsgs(t, "retry.dup.scheduled.d1")) == 1 }, waitFor, 10*time.Millisecond)
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_scheduled_total", "kind", "dup"))
}

// The process dies after committing decisions and before publishing them
// or acking its input. A new scheduler on the same database publishes the
// outbox, gets the messages redelivered and recognises them: nothing lost,
// nothing doubled.
func TestCrashBetweenCommitAndPublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "crash", "", 3, 1000, 1000)
	crashed := make(chan struct{})
	var once atomic.Bool
	a := b.start(t, func(c *scheduler.Config) {
		c.RelayInterval = time.Hour // only Kick or reconciliation would publish
		c.ReconcileInterval = time.Hour
		c.Failpoint = failAt(scheduler.FailpointPolicyCommitted, func(context.Context) error {
			if once.CompareAndSwap(false, true) {
				close(crashed)
			}
			return errCrash
		})
	})
	const n = 20
	for i := range n {
		b.publish(t, contract.Failed, failed("crash", fmt.Sprintf("c%d", i), 1, "timeout"))
	}
	<-crashed
	b.waitRetries(t, retrystore.ListFilter{Kind: "crash"}, n)
	b.stop(t, a)
	// The relay's first pass at start may publish decisions committed
	// before it ran; the rest wait in the outbox for the next instance.
	// Every input was left unacked either way (the duplicate count below).
	t.Logf("published before the crash: %d of %d", len(b.streamMsgs(t, "retry.crash.scheduled.*")), n)

	c := b.start(t)
	for i := range n {
		b.waitRow(t, "crash", fmt.Sprintf("c%d", i), inState(retrystore.StateDue, 2))
	}
	require.Eventually(t, func() bool {
		return metric(t, c.reg, "retryd_scheduler_duplicate_total", "consumer", "scheduler") == n
	}, waitFor, 10*time.Millisecond, "every unacked input comes back and is recognised")
	for id, count := range msgIDs(b.streamMsgs(t, "retry.crash.scheduled.*")) {
		require.Equal(t, 1, count, id)
	}
	require.Len(t, b.streamMsgs(t, "retry.crash.scheduled.*"), n)
	require.Len(t, b.streamMsgs(t, "retry.crash.due.*"), n)
	for i := range n {
		require.Equal(t, []string{"failed:1", "scheduled:2", "due:2"}, events(b.history(t, "crash", fmt.Sprintf("c%d", i))))
	}
}

// The process dies after its due events were acknowledged and before the
// rows were marked due. The next scheduler publishes them again with the
// same ids; JetStream absorbs the copies (counted as duplicates, not
// emitted).
func TestCrashBetweenDuePublishAndCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "dcrash", "", 3, 10, 10)
	var calls atomic.Int32
	a := b.start(t, func(c *scheduler.Config) {
		c.Failpoint = failAt(scheduler.FailpointDuesPublished, func(context.Context) error {
			calls.Add(1)
			return errCrash
		})
	})
	const n = 10
	for i := range n {
		b.publish(t, contract.Failed, failed("dcrash", fmt.Sprintf("d%d", i), 1, "timeout"))
	}
	require.Eventually(t, func() bool { return len(b.streamMsgs(t, "retry.dcrash.due.*")) == n }, waitFor, 10*time.Millisecond)
	b.stop(t, a)
	require.Positive(t, calls.Load())
	page, err := retrystore.List(b.ctx, b.pool, retrystore.ListFilter{Kind: "dcrash", State: retrystore.StateScheduled})
	require.NoError(t, err)
	require.Len(t, page.Retries, n, "no row was marked due")

	c := b.start(t)
	for i := range n {
		row := b.waitRow(t, "dcrash", fmt.Sprintf("d%d", i), inState(retrystore.StateDue, 2))
		require.Equal(t, 1, row.DueEmissions)
	}
	waitMetric(t, c.reg, float64(n), "retryd_scheduler_due_duplicates_total", "kind", "dcrash")
	require.Zero(t, metric(t, c.reg, "retryd_scheduler_due_total", "kind", "dcrash"))
	requireEachOnce(t, b.streamMsgs(t, "retry.dcrash.due.*"), n)
}

// Two schedulers over one database: every due event is emitted once.
// Copies JetStream absorbs by Nats-Msg-Id are counted apart.
func TestTwoSchedulersEmitEachDueOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "two", "", 3, 200, 200)
	small := func(c *scheduler.Config) { c.BatchSize = 7; c.MaxIdle = 20 * time.Millisecond }
	x := b.start(t, small)
	y := b.start(t, small)
	const n = 300
	for i := range n {
		b.publish(t, contract.Failed, failed("two", fmt.Sprintf("t%d", i), 1, "timeout"))
	}
	b.waitRetries(t, retrystore.ListFilter{Kind: "two", State: retrystore.StateDue, Limit: n}, n)

	stored := b.streamMsgs(t, "retry.two.due.*")
	requireEachOnce(t, stored, n)
	regs := []prometheus.Gatherer{x.reg, y.reg}
	waitMetricSum(t, regs, float64(n), "retryd_scheduler_due_total", "kind", "two")
	waitMetricSum(t, regs, float64(len(stored)-n), "retryd_scheduler_due_duplicates_total")
	both := metric(t, x.reg, "retryd_scheduler_scheduled_total", "kind", "two") + metric(t, y.reg, "retryd_scheduler_scheduled_total", "kind", "two")
	require.Equal(t, float64(n), both, "the failures were shared between the instances")
	page, err := retrystore.List(b.ctx, b.pool, retrystore.ListFilter{Kind: "two", Limit: n})
	require.NoError(t, err)
	for _, r := range page.Retries {
		require.Equal(t, 1, r.DueEmissions)
	}
}

// The process dies after publishing a due and before its commit, and the
// owner's answer to that due comes before any re-send: history still
// equals the stream. The due it answered counts in due_emissions and has
// its history row (under its Nats-Msg-Id), for a success and for a
// failure alike.
func TestOwnerAnswerBeforeTheDueCommitKeepsTheDueInHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "late", "", 3, 10, 10)
	crash := func(c *scheduler.Config) {
		c.Failpoint = failAt(scheduler.FailpointDuesPublished, func(context.Context) error { return errCrash })
	}
	a := b.start(t, crash)
	for _, id := range []string{"ok", "bad"} {
		b.publish(t, contract.Failed, failed("late", id, 1, "timeout"))
	}
	require.Eventually(t, func() bool { return len(b.streamMsgs(t, "retry.late.due.*")) == 2 }, waitFor, 10*time.Millisecond)
	b.stop(t, a)

	// The owners answer the dues they got; the next scheduler still
	// cannot commit a due (so no re-send overtakes the answers).
	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "late", ID: "ok", Attempt: 2})
	b.publish(t, contract.Failed, failed("late", "bad", 2, "timeout"))
	b.start(t, crash)

	row := b.waitRow(t, "late", "ok", func(r retrystore.Retry) bool { return r.State == retrystore.StateSucceeded })
	require.Equal(t, 1, row.DueEmissions, "the due the owner answered counts")
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "succeeded:2"}, events(b.history(t, "late", "ok")))
	h := b.history(t, "late", "ok")[2]
	require.Equal(t, contract.DueMsgID("late", "ok", 2), h.MsgID, "under the id of the due on the stream")

	b.waitRow(t, "late", "bad", inState(retrystore.StateScheduled, 3))
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "failed:2", "rescheduled:3"}, events(b.history(t, "late", "bad")))
}
