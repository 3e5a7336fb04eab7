package scheduler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/retrystore"
	"github.com/retryd/retryd/services/scheduler"
)

// A peer frozen mid-batch (SIGSTOP, a partition) keeps its transaction,
// and with it its items, open. This instance hands that item's facts back
// and applies the others at once, instead of waiting the lock timeout on
// each (fault scenario 3 saw 0 retries resolved in 40 s).
func TestItemHeldByFrozenPeerDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Without the hand-back, the others would wait a minute behind the
	// held item: longer than the deadline below.
	s := b.start(t, func(c *scheduler.Config) { c.LockTimeout = time.Minute })
	b.policy(t, "busy", "", 3, 60_000, 60_000)
	b.failTo(t, "busy", "held", 1, "timeout", retrystore.StateScheduled)

	// The frozen peer: a transaction holding the item as the policy stage
	// does (its advisory lock and its row).
	peer, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer peer.Rollback(b.ctx) //nolint:errcheck // committed below
	_, err = retrystore.TryLockItems(b.ctx, peer, []retrystore.Key{{Kind: "busy", ItemID: "held"}})
	require.NoError(t, err)
	_, err = retrystore.GetManyForUpdate(b.ctx, peer, []retrystore.Key{{Kind: "busy", ItemID: "held"}})
	require.NoError(t, err)

	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "busy", ID: "held", Attempt: 2})
	for _, id := range []string{"a", "b", "c"} {
		b.publish(t, contract.Failed, failed("busy", id, 1, "timeout"))
	}
	require.Eventually(t, func() bool {
		n := 0
		for _, id := range []string{"a", "b", "c"} {
			if r, err := retrystore.Get(b.ctx, b.pool, "busy", id); err == nil && r.State == retrystore.StateScheduled {
				n++
			}
		}
		return n == 3
	}, 20*time.Second, 20*time.Millisecond, "the other items are applied while one is held")
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_busy_total") >= 1
	}, waitFor, 20*time.Millisecond)
	r, err := retrystore.Get(b.ctx, b.pool, "busy", "held")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, r.State, "not applied while held")

	// The peer thaws and commits: the handed-back fact is applied once.
	require.NoError(t, peer.Commit(b.ctx))
	b.waitRow(t, "busy", "held", inState(retrystore.StateSucceeded, 2))
}
