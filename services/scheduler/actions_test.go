package scheduler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// Cancelling a waiting retry publishes cancelled and no due follows, even
// once its time has passed.
func TestCancelBeforeDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "cx", "", 3, int64(time.Hour/time.Millisecond), int64(time.Hour/time.Millisecond))
	b.policy(t, "cx-fast", "", 3, 10, 10)

	b.failTo(t, "cx", "c1", 1, "timeout", retrystore.StateScheduled)
	row, err := s.Cancel(b.ctx, "cx", "c1", "alice", "customer asked")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateCancelled, row.State)
	require.NotNil(t, row.ResolvedAt)

	// Had the row stayed scheduled, this would make it due now.
	_, err = b.pool.Exec(b.ctx, `UPDATE retries SET next_attempt_at = now() - interval '1 second' WHERE item_id = 'c1'`)
	require.NoError(t, err)
	// A later retry coming due proves the due loop ran past the cancelled
	// one.
	b.failTo(t, "cx-fast", "marker", 1, "timeout", retrystore.StateDue)
	require.Empty(t, b.streamMsgs(t, "retry.cx.due.c1"))

	require.Eventually(t, func() bool { return len(b.streamMsgs(t, "retry.cx.cancelled.c1")) == 1 }, waitFor, 10*time.Millisecond)
	cm := b.streamMsgs(t, "retry.cx.cancelled.c1")[0]
	require.Equal(t, "cx-cancelled:c1:2", cm.Headers().Get(contract.HeaderMsgID))
	ev, err := contract.DecodeLifecycle(cm.Subject(), cm.Data())
	require.NoError(t, err)
	require.Equal(t, "alice", ev.Cancelled.By)
	require.Equal(t, "customer asked", ev.Cancelled.Reason)

	h := b.history(t, "cx", "c1")
	require.Equal(t, []string{"failed:1", "scheduled:2", "cancelled:2"}, events(h))
	require.JSONEq(t, `{"by":"alice","reason":"customer asked"}`, string(h[2].Detail))

	// The cancelled event comes back through the consumer: the inbox
	// makes it a duplicate.
	waitMetric(t, s.reg, 1, "retryd_scheduler_duplicate_total", "consumer", "scheduler")
	_, err = s.Cancel(b.ctx, "cx", "c1", "alice", "")
	require.ErrorIs(t, err, scheduler.ErrConflict)
	require.ErrorContains(t, err, "cancel cx/c1: it is in state cancelled, not pending")
	_, err = s.Cancel(b.ctx, "cx", "nope", "alice", "")
	require.ErrorIs(t, err, scheduler.ErrNotFound)
	_, err = s.Cancel(b.ctx, "cx", "bad.id", "alice", "")
	require.ErrorIs(t, err, contract.ErrInvalid)
}

// Cancelling after due works too: the owner's later failure of that
// attempt is stale and nothing is rescheduled.
func TestCancelAfterDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "cd", "", 3, 10, 10)

	b.failTo(t, "cd", "c2", 1, "timeout", retrystore.StateDue)
	_, err := s.Cancel(b.ctx, "cd", "c2", "", "")
	require.NoError(t, err)
	b.publish(t, contract.Failed, failed("cd", "c2", 2, "timeout"))
	waitMetric(t, s.reg, 1, "retryd_scheduler_stale_total", "kind", "cd", "event", "failed")
	row, err := retrystore.Get(b.ctx, b.pool, "cd", "c2")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateCancelled, row.State)
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "cancelled:2"}, events(b.history(t, "cd", "c2")))
	require.Empty(t, b.streamMsgs(t, "retry.cd.rescheduled.c2"))

	// An owner may cancel an item too, even one that never failed: a
	// later failure is then not retried.
	b.publish(t, contract.Cancelled, contract.CancelledData{Kind: "cd", ID: "c3", By: "owner"})
	b.waitRow(t, "cd", "c3", inState(retrystore.StateCancelled, 0))
	b.publish(t, contract.Failed, failed("cd", "c3", 1, "timeout"))
	waitMetric(t, s.reg, 2, "retryd_scheduler_stale_total", "kind", "cd", "event", "failed")
	require.Equal(t, 2.0, metric(t, s.reg, "retryd_scheduler_cancelled_total", "kind", "cd"))
}

// A manual retry runs a new attempt now, from any state, and publishes
// rescheduled with decided_by manual. Without reset the budget stays used
// up; with reset the item gets its retries back while attempts keep
// growing.
func TestManualRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "mr", "", 1, 10, 10)

	b.failTo(t, "mr", "m1", 1, "timeout", retrystore.StateDue)
	b.publish(t, contract.Failed, failed("mr", "m1", 2, "timeout"))
	b.waitRow(t, "mr", "m1", inState(retrystore.StateExhausted, 2))

	row, err := s.RetryNow(b.ctx, "mr", "m1", scheduler.RetryNowOptions{Reason: "fixed the bug", By: "bob"})
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, row.State)
	require.Equal(t, 3, row.Attempt)
	require.Equal(t, 2, row.RetryCount)
	b.waitRow(t, "mr", "m1", inState(retrystore.StateDue, 3))
	h := b.history(t, "mr", "m1")
	manual := h[len(h)-2]
	require.Equal(t, "rescheduled", manual.Event)
	require.Equal(t, contract.DecidedByManual, manual.DecidedBy)
	require.Contains(t, string(manual.Detail), "manual retry by bob: fixed the bug")
	require.Len(t, b.streamMsgs(t, "retry.mr.due.m1"), 2)
	require.Equal(t, 1, msgIDs(b.streamMsgs(t, "retry.mr.due.m1"))["mr-retry:m1:3"])

	// The budget is still used up: the next failure exhausts.
	b.publish(t, contract.Failed, failed("mr", "m1", 3, "timeout"))
	b.waitRow(t, "mr", "m1", inState(retrystore.StateExhausted, 3))

	// With reset, one more retry is allowed again.
	row, err = s.RetryNow(b.ctx, "mr", "m1", scheduler.RetryNowOptions{ResetAttempts: true})
	require.NoError(t, err)
	require.Equal(t, 4, row.Attempt)
	require.Equal(t, 3, row.BudgetBase)
	require.Equal(t, 0, row.RetryCount)
	b.waitRow(t, "mr", "m1", inState(retrystore.StateDue, 4))
	row = b.failTo(t, "mr", "m1", 4, "timeout", retrystore.StateDue)
	require.Equal(t, 1, row.RetryCount)
	b.publish(t, contract.Failed, failed("mr", "m1", 5, "timeout"))
	b.waitRow(t, "mr", "m1", inState(retrystore.StateExhausted, 5))

	// A retry that is waiting is replaced without using budget.
	b.policy(t, "mr-wait", "", 3, int64(time.Hour/time.Millisecond), int64(time.Hour/time.Millisecond))
	b.failTo(t, "mr-wait", "w", 1, "timeout", retrystore.StateScheduled)
	row, err = s.RetryNow(b.ctx, "mr-wait", "w", scheduler.RetryNowOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, row.Attempt)
	require.Equal(t, 1, row.RetryCount)
	b.waitRow(t, "mr-wait", "w", inState(retrystore.StateDue, 3))

	// Cancelled items can be retried by hand as well.
	_, err = s.Cancel(b.ctx, "mr-wait", "w", "", "")
	require.NoError(t, err)
	_, err = s.RetryNow(b.ctx, "mr-wait", "w", scheduler.RetryNowOptions{})
	require.NoError(t, err)
	b.waitRow(t, "mr-wait", "w", inState(retrystore.StateDue, 4))

	_, err = s.RetryNow(b.ctx, "mr", "missing", scheduler.RetryNowOptions{})
	require.ErrorIs(t, err, scheduler.ErrNotFound)
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_scheduled_total", "kind", "mr"))
	require.Equal(t, 3.0, metric(t, s.reg, "retryd_scheduler_rescheduled_total", "kind", "mr"))
}

func TestRetryNowOptionsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	long := make([]byte, scheduler.MaxReasonLen+1)
	for i := range long {
		long[i] = 'x'
	}
	_, err := s.RetryNow(b.ctx, "job", "a", scheduler.RetryNowOptions{Reason: string(long)})
	var fe *contract.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "reason", fe.Field)
	_, err = s.RetryNow(b.ctx, "Job", "a", scheduler.RetryNowOptions{})
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "kind", fe.Field)
}
