package scheduler_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// remote is a scheduler on b's database that is never started: what the
// home shard's jobs API holds for each other shard.
func remote(t *testing.T, b *bundle, shard, shards int) *scheduler.Scheduler {
	t.Helper()
	s, err := scheduler.New(scheduler.Config{Pool: b.pool, JS: b.js, Logger: servicetest.Logger(t), Shards: shards, Shard: shard})
	require.NoError(t, err)
	return s
}

// The jobs API of the home shard cancels and retries items on every
// shard: each action lands in the database of the item's shard, through
// a scheduler that was never started, and its fact is published at once.
// During a resharding (2 to 4) an item not yet moved is found on its
// shard under the old count.
func TestShardedRetryControllerActsOnTheItemsShard(t *testing.T) {
	t.Parallel()
	s := splitSetup(t, otherDatabasePool)
	s.policy(t, "alpha", 60_000)
	inst := s.start(t)

	var fails []*nats.Msg
	want := [2]map[string]retrystore.State{{}, {}}
	var ids [2][]string
	for i := range 20 {
		id := fmt.Sprintf("job-%02d", i)
		k := contract.Shard("alpha", id, 2)
		ids[k] = append(ids[k], id)
		fails = append(fails, lifecycleMsg(t, contract.Failed, failed("alpha", id, 1, "timeout")))
		want[k]["alpha/"+id] = retrystore.StateScheduled
	}
	require.NotEmpty(t, ids[0])
	require.NotEmpty(t, ids[1])
	publishAll(t, s[0], fails)
	for k, b := range s {
		b.waitRows(t, want[k], "alpha")
	}

	c := scheduler.ShardedRetryController{Shards: []*scheduler.Scheduler{inst[0].Scheduler, remote(t, s[1], 1, 2)}}
	for k := range s {
		id := ids[k][0]
		require.NoError(t, c.Cancel(s[0].ctx, "alpha", id, "ops", "test"))
		want[k]["alpha/"+id] = retrystore.StateCancelled
	}
	for k, b := range s {
		b.waitRows(t, want[k], "alpha")
	}
	cancelled := natstest.Messages(t, s[0].ctx, s[0].js, contract.StreamRetries, contract.RetryFilter("alpha", contract.Cancelled))
	require.Len(t, cancelled, 2, "each action's fact published once")

	// Retry now, on shard 1, from a database this process does not run.
	id := ids[1][1]
	require.NoError(t, c.RetryNow(s[0].ctx, "alpha", id, "again", "ops", false, ""))
	require.Eventually(t, func() bool {
		return len(natstest.Messages(t, s[0].ctx, s[0].js, contract.StreamRetries, contract.RetrySubject("alpha", contract.Due, id)+".*")) == 1
	}, waitFor, 20*time.Millisecond)

	err := c.Cancel(s[0].ctx, "alpha", "no-such-job", "ops", "test")
	require.True(t, errors.Is(err, scheduler.ErrNotFound), "%v", err)

	// Resharding 2 to 4, rows not moved yet: shards 2 and 3 are empty.
	empty := *s[0]
	empty.pool = otherDatabasePool(t, s[0].ctx)
	e := remote(t, &empty, 2, 4)
	c4 := scheduler.ShardedRetryController{Shards: []*scheduler.Scheduler{inst[0].Scheduler, remote(t, s[1], 1, 4), e, e}}
	var moving string
	for _, id := range ids[0][1:] {
		if contract.Shard("alpha", id, 4) == 2 {
			moving = id
			break
		}
	}
	require.NotEmpty(t, moving, "an item of shard 0 that 4 shards place on shard 2")
	require.NoError(t, c4.Cancel(s[0].ctx, "alpha", moving, "ops", "test"), "found on its shard under 2")
	want[0]["alpha/"+moving] = retrystore.StateCancelled
	s[0].waitRows(t, want[0], "alpha")
}

// An unsplit scheduler still running when RETRIES is split (the first
// step of resharding from one shard) decides the facts of the items that
// stay on shard 0, stored with token 0 from then on; those of shard 1
// wait in the stream for their shard.
func TestUnsplitSchedulerTakesTokenZeroAfterASplit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "alpha", "", 3, 60_000, 60_000)
	b.start(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Storage: jetstream.MemoryStorage, Shards: 2}))

	var stay, move string
	for i := 0; stay == "" || move == ""; i++ {
		id := fmt.Sprintf("split-%03d", i)
		if contract.Shard("alpha", id, 2) == 0 && stay == "" {
			stay = id
		} else if contract.Shard("alpha", id, 2) == 1 && move == "" {
			move = id
		}
	}
	publishAll(t, b, []*nats.Msg{
		lifecycleMsg(t, contract.Failed, failed("alpha", stay, 1, "timeout")),
		lifecycleMsg(t, contract.Failed, failed("alpha", move, 1, "timeout")),
	})
	b.waitRows(t, map[string]retrystore.State{"alpha/" + stay: retrystore.StateScheduled}, "alpha")
	require.True(t, natstest.Settled(t, b.ctx, b.js, contract.StreamRetries, scheduler.ConsumerName))
	_, ok := b.rows(t, "alpha")["alpha/"+move]
	require.False(t, ok, "shard 1's item waits for its shard")
}
