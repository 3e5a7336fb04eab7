package scheduler_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// RETRIES purged with 10,000 retries pending: they live in Postgres, so
// every one still comes due, once.
func TestPurgedStreamPendingStillComeDue(t *testing.T) {
	if testing.Short() {
		t.Skip("10k retries")
	}
	t.Parallel()
	b := setup(t)
	b.start(t, func(c *scheduler.Config) { c.ConsumeBatch = 500; c.MaxAckPending = 5000 })
	b.policy(t, "bulk", "", 3, int64(time.Hour/time.Millisecond), int64(time.Hour/time.Millisecond))

	const n = 10_000
	var mu sync.Mutex
	seen := map[string]int{}
	sub, err := b.nc.Subscribe("retry.bulk.due.*", func(m *nats.Msg) {
		mu.Lock()
		seen[m.Header.Get(contract.HeaderMsgID)]++
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		msgs[i] = lifecycleMsg(t, contract.Failed, failed("bulk", fmt.Sprintf("b%05d", i), 1, "timeout"))
	}
	publishAll(t, b, msgs)
	countState := func(state retrystore.State) int {
		return pgtest.Count(t, b.pool, `SELECT count(*) FROM retries WHERE kind = 'bulk' AND state = $1`, string(state))
	}
	require.Eventually(t, func() bool { return countState(retrystore.StateScheduled) == n }, 2*time.Minute, 50*time.Millisecond)
	b.waitQuiet(t) // every scheduled event published: nothing arrives after the purge

	stream, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.NoError(t, stream.Purge(b.ctx))
	info, err := stream.Info(b.ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs)

	// An hour passes.
	_, err = b.pool.Exec(b.ctx, `UPDATE retries SET next_attempt_at = now() + interval '200 milliseconds' WHERE kind = 'bulk'`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return countState(retrystore.StateDue) == n }, 2*time.Minute, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, waitFor, 20*time.Millisecond)
	requireEachOnce(t, b.streamMsgs(t, "retry.bulk.due.*"), n)
}

// A deleted consumer and a deleted stream are recreated by reconciliation;
// a retry pending meanwhile still comes due in the new stream.
func TestReconcileRecreatesConsumerAndStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, func(c *scheduler.Config) { c.ReconcileInterval = 100 * time.Millisecond })
	b.policy(t, "rc", "", 3, 10, 10)
	b.policy(t, "rc-slow", "", 3, 1500, 1500)

	require.NoError(t, b.js.DeleteConsumer(b.ctx, contract.StreamRetries, scheduler.ConsumerName))
	require.Eventually(t, func() bool {
		_, err := b.js.Consumer(b.ctx, contract.StreamRetries, scheduler.ConsumerName)
		return err == nil
	}, waitFor, 20*time.Millisecond)
	b.publish(t, contract.Failed, failed("rc", "after-consumer", 1, "timeout"))
	b.waitRow(t, "rc", "after-consumer", inState(retrystore.StateDue, 2))

	b.publish(t, contract.Failed, failed("rc-slow", "pending", 1, "timeout"))
	b.waitRow(t, "rc-slow", "pending", inState(retrystore.StateScheduled, 2))
	require.NoError(t, b.js.DeleteStream(b.ctx, contract.StreamRetries))

	b.waitRow(t, "rc-slow", "pending", inState(retrystore.StateDue, 2))
	dues := b.streamMsgs(t, "retry.rc-slow.due.pending")
	require.Len(t, dues, 1)
	require.Equal(t, contract.DueMsgID("rc-slow", "pending", 2), dues[0].Headers().Get(contract.HeaderMsgID))

	var ack *jetstream.PubAck
	require.Eventually(t, func() bool {
		msg := lifecycleMsg(t, contract.Failed, failed("rc", "after-stream", 1, "timeout"))
		var err error
		ack, err = b.js.PublishMsg(b.ctx, msg)
		return err == nil
	}, waitFor, 20*time.Millisecond)
	require.NotNil(t, ack)
	b.waitRow(t, "rc", "after-stream", inState(retrystore.StateDue, 2))
}

// A due retry whose owner never reports back is published again after
// RedueAfter, with the same Nats-Msg-Id.
func TestRedueAfterTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t, func(c *scheduler.Config) { c.ReconcileInterval = time.Hour })
	b.policy(t, "rd", "", 3, 10, 10)

	// RedueAfter (5m by default, always above the 2m duplicate window)
	// cannot pass in a test: a re-emission is stored because the window is
	// shrunk, and due_at moves back as if the time had passed.
	shrinkDuplicateWindow(t, b, 100*time.Millisecond)

	b.publish(t, contract.Failed, failed("rd", "r1", 1, "timeout"))
	b.waitRow(t, "rd", "r1", inState(retrystore.StateDue, 2))

	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(b.ctx, `UPDATE retries SET due_at = now() - interval '6 minutes' WHERE kind = 'rd' AND item_id = 'r1'`)
		require.NoError(t, err)
		return len(b.streamMsgs(t, "retry.rd.due.r1")) >= 2
	}, waitFor, 200*time.Millisecond)

	ids := msgIDs(b.streamMsgs(t, "retry.rd.due.r1"))
	require.Len(t, ids, 1, "every emission of an attempt carries the same id")
	require.GreaterOrEqual(t, ids[contract.DueMsgID("rd", "r1", 2)], 2)
	b.waitRow(t, "rd", "r1", func(r retrystore.Retry) bool { return r.DueEmissions >= 2 })
	// The last push may still cause one more re-emission: read the row and
	// its history in one snapshot.
	tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // read only
	row, err := retrystore.Get(b.ctx, tx, "rd", "r1")
	require.NoError(t, err)
	hist, err := retrystore.History(b.ctx, tx, "rd", "r1")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateDue, row.State)
	require.Equal(t, 2, row.Attempt)
	dueRows := 0
	for _, h := range hist {
		if h.Event == "due" {
			dueRows++
		}
	}
	require.Equal(t, row.DueEmissions, dueRows)
	// The counter moves after the emission's commit (CI run AA read it
	// between the two): wait for it.
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_redue_total", "kind", "rd") >= 1
	}, waitFor, 20*time.Millisecond)
}

// The unsplit scheduler's .0 filters match nothing until RETRIES is split
// and must be there before it is: `retryd shards split` gives them to
// shard 0's consumer first, and a running unsplit scheduler that dropped
// them (at its next consumer check, or on a restart with its old count)
// would pass over the facts stored with token 0 for good. Its
// description says so, for whoever reads them in `nats consumer info`.
func TestConsumerConfigShardZeroTakesTokenZeroFromTheStart(t *testing.T) {
	t.Parallel()
	unsplit := scheduler.ConsumerConfig(scheduler.Config{})
	split := scheduler.ConsumerConfig(scheduler.Config{Shards: 4, Shard: 0})
	require.Equal(t, split.FilterSubjects, unsplit.FilterSubjects, "a split changes nothing shard 0 takes")
	for _, ev := range []contract.Lifecycle{contract.Failed, contract.Held, contract.Succeeded, contract.Cancelled} {
		require.Contains(t, unsplit.FilterSubjects, contract.RetryUnsplitFilter("*", ev))
		require.Contains(t, unsplit.FilterSubjects, contract.RetryShardFilter(ev, 0))
	}
	for _, cfg := range []jetstream.ConsumerConfig{unsplit, split} {
		require.Contains(t, cfg.Description, "token 0 (.0)")
		require.Contains(t, cfg.Description, "docs/shards.md")
	}
	other := scheduler.ConsumerConfig(scheduler.Config{Shards: 4, Shard: 1})
	require.NotContains(t, other.FilterSubjects, contract.RetryShardFilter(contract.Failed, 0))
	require.NotContains(t, other.Description, "token 0")
}
