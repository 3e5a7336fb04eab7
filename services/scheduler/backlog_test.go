package scheduler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// While the policy stage holds facts it has not applied, an owner's
// outcome may be among them: a due row past RedueAfter is not re-emitted
// until the stage has caught up (fault scenario 4 ran a retry twice
// without this). Once it has, the re-emission goes out.
func TestRedueWaitsForPolicyStageBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var stall atomic.Bool
	s := b.start(t, func(c *scheduler.Config) {
		c.ReconcileInterval = time.Hour
		c.Failpoint = failAt(scheduler.FailpointPolicyCommitted, func(context.Context) error {
			if stall.Load() {
				return errors.New("stalled by the test")
			}
			return nil
		})
	})
	b.policy(t, "lag", "", 3, 10, 10)
	shrinkDuplicateWindow(t, b, 100*time.Millisecond)

	b.failTo(t, "lag", "r1", 1, "timeout", retrystore.StateDue)

	// r2's fact is applied but never acked while stalled: the consumer
	// holds it, so the stage counts as behind by the age of r1's fact.
	stall.Store(true)
	b.publish(t, contract.Failed, failed("lag", "r2", 1, "timeout"))
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_policy_lag_seconds") > 0
	}, waitFor, 50*time.Millisecond, "the due loop sees the backlog")

	// Exactly RedueAfter old now, and older by the time that passes: the
	// lag grows as fast, so the row never qualifies while stalled.
	_, err := b.pool.Exec(b.ctx, `UPDATE retries SET due_at = now() - make_interval(secs => $1) WHERE kind = 'lag' AND item_id = 'r1'`,
		scheduler.DefaultRedueAfter.Seconds())
	require.NoError(t, err)
	require.Never(t, func() bool {
		return len(b.streamMsgs(t, "retry.lag.due.r1")) > 1
	}, 3*time.Second, 100*time.Millisecond, "re-emitted while the policy stage was behind")
	require.Zero(t, metric(t, s.reg, "retryd_scheduler_redue_total", "kind", "lag"))

	// r2's fact is redelivered after AckWait and acked: caught up.
	stall.Store(false)
	require.Eventually(t, func() bool {
		return len(b.streamMsgs(t, "retry.lag.due.r1")) == 2
	}, waitFor, 100*time.Millisecond, "re-emitted once the policy stage caught up")
	// The due loop counts a re-emission after the publish the stream
	// already shows: wait for the count rather than race it.
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_redue_total", "kind", "lag") == 1.0 &&
			metric(t, s.reg, "retryd_scheduler_policy_lag_seconds") == 0
	}, waitFor, 50*time.Millisecond, "one re-emission counted, no lag left")
	require.Never(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_redue_total", "kind", "lag") > 1.0
	}, time.Second, 100*time.Millisecond, "re-emitted once")
}
