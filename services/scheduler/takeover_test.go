package scheduler_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// A killed instance keeps every fact it was handed unacked until the ack
// wait runs out. The next instance must decide new facts meanwhile: the
// consumer's MaxAckPending leaves room beyond one instance's share.
// The ack wait here is a minute, longer than the test waits, so only that
// room can let the new facts through.
func TestKilledInstanceDoesNotBlindTheNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "kill", "", 3, 60_000, 60_000)
	ncA, jsA := natstest.Connect(t, b.srv)
	killed := make(chan struct{})
	a, err := scheduler.New(scheduler.Config{
		Pool: b.pool, JS: jsA, Logger: servicetest.Logger(t), AckWait: time.Minute,
		Failpoint: failAt(scheduler.FailpointPolicyCommitted, func(ctx context.Context) error {
			select { // the process hangs here until it is killed
			case <-killed:
			case <-ctx.Done():
			}
			return errCrash
		}),
	})
	require.NoError(t, err)
	require.NoError(t, a.Start(b.ctx))
	t.Cleanup(func() {
		close(killed)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(ctx) // its connection is gone: the drain may fail
	})

	// The instance hangs on its first batch: it holds that batch, its
	// full queue (ConsumeBatch) and its client's pull buffer. Before, one
	// instance's pull (1000) filled MaxAckPending (1000) alone.
	const held = 1200
	for i := range held {
		b.publish(t, contract.Failed, failed("kill", fmt.Sprintf("old-%d", i), 1, "timeout"))
	}
	cons, err := b.js.Consumer(b.ctx, contract.StreamRetries, scheduler.ConsumerName)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(b.ctx)
		require.NoError(t, err)
		return info.NumAckPending > scheduler.DefaultConsumeBatch
	}, waitFor, 10*time.Millisecond, "the first instance takes its share")
	ncA.Close() // kill -9: no ack, no in-progress ack, no drain

	b.start(t, func(c *scheduler.Config) { c.AckWait = time.Minute })
	const fresh = 50
	for i := range fresh {
		b.publish(t, contract.Failed, failed("kill", fmt.Sprintf("new-%d", i), 1, "timeout"))
	}
	for i := range fresh {
		b.waitRow(t, "kill", fmt.Sprintf("new-%d", i), inState(retrystore.StateScheduled, 2))
	}
	info, err := cons.Info(b.ctx)
	require.NoError(t, err)
	require.Greater(t, info.NumAckPending, scheduler.DefaultConsumeBatch, "the dead instance's share still waits out its ack wait")
}

// A batch that takes longer than the ack wait (a lock wait, a slow
// database) is kept by in-progress acks: its facts are not redelivered,
// so the short ack wait costs no duplicate work.
func TestSlowBatchIsNotRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "slow", "", 3, 60_000, 60_000)
	var inst atomic.Pointer[instance]
	var slowed atomic.Bool
	started := b.start(t, func(c *scheduler.Config) {
		c.AckWait = time.Second
		c.Failpoint = failAt(scheduler.FailpointPolicyCommitted, func(ctx context.Context) error {
			if !slowed.CompareAndSwap(false, true) {
				return nil
			}
			// Hold the first batch until six in-progress acks went out
			// (a quarter of the ack wait apart: 1.5 ack waits), polling,
			// not sleeping.
			deadline := time.Now().Add(waitFor)
			for metric(t, inst.Load().reg, "retryd_scheduler_in_progress_acks_total") < 6 {
				if time.Now().After(deadline) {
					return fmt.Errorf("no in-progress acks: %w", errCrash)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
			return nil
		})
	})
	inst.Store(&started)
	b.failTo(t, "slow", "s1", 1, "timeout", retrystore.StateScheduled)
	// A fact published after the slow batch is applied after any copy
	// redelivered during it: once it is decided, a copy would have been
	// counted.
	b.failTo(t, "slow", "s2", 1, "timeout", retrystore.StateScheduled)
	require.Eventually(t, func() bool {
		info, err := b.js.Consumer(b.ctx, contract.StreamRetries, scheduler.ConsumerName)
		require.NoError(t, err)
		ci, err := info.Info(b.ctx)
		require.NoError(t, err)
		return ci.NumAckPending == 0
	}, waitFor, 10*time.Millisecond)
	require.GreaterOrEqual(t, metric(t, started.reg, "retryd_scheduler_in_progress_acks_total"), 6.0)
	require.Zero(t, metric(t, started.reg, "retryd_scheduler_duplicate_total", "consumer", "scheduler"),
		"no fact of the slow batch came back")
}
