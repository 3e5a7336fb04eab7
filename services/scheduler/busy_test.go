package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// startWithFrozenPeer starts a scheduler whose lock waits last a minute
// (longer than the tests' deadlines: without the hand-back, the other
// items would wait behind the held one), schedules kind/held, and begins
// the transaction of a frozen peer, rolled back at the end of the test.
func startWithFrozenPeer(t *testing.T, kind string) (*bundle, instance, pgx.Tx) {
	t.Helper()
	b := setup(t)
	s := b.start(t, func(c *scheduler.Config) { c.LockTimeout = time.Minute })
	b.policy(t, kind, "", 3, 60_000, 60_000)
	b.failTo(t, kind, "held", 1, "timeout", retrystore.StateScheduled)
	peer, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = peer.Rollback(context.WithoutCancel(b.ctx)) })
	return b, s, peer
}

// A peer frozen mid-batch (SIGSTOP, a partition) keeps its transaction,
// and with it its items, open. This instance hands that item's facts back
// and applies the others at once, instead of waiting the lock timeout on
// each (fault scenario 3 saw 0 retries resolved in 40 s).
func TestItemHeldByFrozenPeerDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	b, s, peer := startWithFrozenPeer(t, "busy")
	// The peer holds the item as the policy stage does (its advisory lock
	// and its row).
	_, err := retrystore.TryLockItems(b.ctx, peer, []retrystore.Key{{Kind: "busy", ItemID: "held"}})
	require.NoError(t, err)
	_, _, err = retrystore.TryGetManyForUpdate(b.ctx, peer, []retrystore.Key{{Kind: "busy", ItemID: "held"}})
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

// The due loop's claims (and the releases, the operator actions) lock a
// row without the item's advisory lock. A peer frozen inside one holds
// the row; this instance hands that item's fact back instead of waiting
// the lock timeout on it (fault scenario 3 under load resolved 0 retries
// in 8 s, each batch failing on lock_timeout, then each message alone).
func TestRowLockedWithoutAdvisoryLockDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	b, s, peer := startWithFrozenPeer(t, "rowlock")
	// The peer holds the row as a due claim does: FOR UPDATE, no advisory
	// lock.
	_, err := peer.Exec(b.ctx, `SELECT 1 FROM retries WHERE kind = $1 AND item_id = $2 FOR UPDATE`, "rowlock", "held")
	require.NoError(t, err)

	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "rowlock", ID: "held", Attempt: 2})
	b.publish(t, contract.Failed, failed("rowlock", "other", 1, "timeout"))
	require.Eventually(t, func() bool {
		r, err := retrystore.Get(b.ctx, b.pool, "rowlock", "other")
		return err == nil && r.State == retrystore.StateScheduled
	}, 20*time.Second, 20*time.Millisecond, "the other item is applied while the row is held")
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_busy_total") >= 1
	}, waitFor, 20*time.Millisecond, "the held item's fact is handed back")
	require.Zero(t, metric(t, s.reg, "retryd_scheduler_errors_total", "stage", "policy"), "no transaction failed")
	r, err := retrystore.Get(b.ctx, b.pool, "rowlock", "held")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, r.State, "not applied while held")

	// The peer thaws and ends: the handed-back fact is applied once.
	require.NoError(t, peer.Rollback(b.ctx))
	b.waitRow(t, "rowlock", "held", inState(retrystore.StateSucceeded, 2))
	b.waitQuiet(t)
	require.Equal(t, []string{"failed:1", "scheduled:2", "succeeded:2"}, events(b.history(t, "rowlock", "held")))
}
