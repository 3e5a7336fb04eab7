package scheduler_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgcluster"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// shardKinds are the kinds the shard tests publish: the shard of an item
// hashes its kind too, so two kinds place the same ids differently.
var shardKinds = []string{"alpha", "beta"}

// shardItem is one item of a shard test, with the shard that owns it.
type shardItem struct {
	kind, id string
	shard    int
}

// shardBundles are the bundles of a 2-shard deployment: one NATS server
// and stream, one database per shard (index = shard).
type shardBundles [2]*bundle

// splitSetup starts the backends of two shards: the pgtest database for
// shard 0 and other for shard 1, one NATS server, RETRIES split in 2.
func splitSetup(t *testing.T, other func(*testing.T, context.Context) *pgxpool.Pool) shardBundles {
	t.Helper()
	b0 := setup(t)
	b1 := *b0
	b1.pool = other(t, b0.ctx)
	require.NoError(t, streams.Ensure(b0.ctx, b0.js, streams.Options{Storage: jetstream.MemoryStorage, Shards: 2}))
	return shardBundles{b0, &b1}
}

// ownClusterPool is a migrated database on a Postgres server of its own,
// started for the test and stopped when it ends: a shard that shares no
// server with the others, as in production. With TEST_DATABASE_URL set the
// tests must use that server, so it is a second database on it.
func ownClusterPool(t *testing.T, ctx context.Context) *pgxpool.Pool {
	t.Helper()
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Logf("%s is set: shard 1 is a second database on that server, not a cluster of its own", pgtest.EnvURL)
		return pgtest.NewPool(t)
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Stop(ctx))
	})
	require.NoError(t, migrations.Up(ctx, c.URL("postgres"), zerolog.Nop()))
	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close) // before the stop registered above
	return pool
}

func otherDatabasePool(t *testing.T, _ context.Context) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t)
}

// start starts the scheduler of each shard on its own database.
func (s shardBundles) start(t *testing.T) [2]instance {
	t.Helper()
	var out [2]instance
	for k, b := range s {
		out[k] = b.start(t, func(c *scheduler.Config) {
			c.Shards, c.Shard = 2, k
			c.Streams.Shards = 2
		})
	}
	return out
}

// policy stores the same policy in each shard's database: policies are
// per database, and an item's shard decides by its own.
func (s shardBundles) policy(t *testing.T, kind string, baseMS int64) {
	t.Helper()
	for _, b := range s {
		b.policy(t, kind, "", 3, baseMS, max(baseMS, 100))
	}
}

// waitQuiet waits until each shard's consumer has nothing pending and
// each outbox is empty.
func (s shardBundles) waitQuiet(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for k, b := range s {
			if !natstest.Settled(t, b.ctx, b.js, contract.StreamRetries, scheduler.ConsumerNameOf(k)) {
				return false
			}
			if pgtest.Count(t, b.pool, `SELECT count(*) FROM outbox`) > 0 {
				return false
			}
		}
		return true
	}, waitFor, 20*time.Millisecond)
}

// rows reads every retry row of kinds in a shard's database, keyed
// kind/id.
func (b *bundle) rows(t *testing.T, kinds ...string) map[string]retrystore.State {
	t.Helper()
	rs, err := b.pool.Query(b.ctx, `SELECT kind, item_id, state FROM retries WHERE kind = ANY($1)`, kinds)
	require.NoError(t, err)
	defer rs.Close()
	out := map[string]retrystore.State{}
	for rs.Next() {
		var kind, id string
		var state retrystore.State
		require.NoError(t, rs.Scan(&kind, &id, &state))
		out[kind+"/"+id] = state
	}
	require.NoError(t, rs.Err())
	return out
}

// waitRows waits until a shard's database holds exactly want (kind/id to
// state) for kinds, and fails naming the difference.
func (b *bundle) waitRows(t *testing.T, want map[string]retrystore.State, kinds ...string) {
	t.Helper()
	var got map[string]retrystore.State
	ok := assertEventually(func() bool {
		got = b.rows(t, kinds...)
		return mapsEqual(got, want)
	})
	if !ok {
		require.Equal(t, want, got)
	}
}

func assertEventually(cond func() bool) bool {
	deadline := time.Now().Add(waitFor)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mapsEqual[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// wireDues counts every due event published, by Nats-Msg-Id, as a core
// NATS subscriber sees it. JetStream drops a second publish of the same
// id inside the duplicate window, so the stream alone could not show a
// due emitted twice (by both shards, say); the wire does.
type wireDues struct {
	mu    sync.Mutex
	count map[string]int
}

func countWireDues(t *testing.T, nc *nats.Conn) *wireDues {
	t.Helper()
	w := &wireDues{count: map[string]int{}}
	sub, err := nc.Subscribe(contract.RetryFilter("*", contract.Due), func(m *nats.Msg) {
		w.mu.Lock()
		w.count[m.Header.Get(contract.HeaderMsgID)]++
		w.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *wireDues) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.count))
	for k, v := range w.count {
		out[k] = v
	}
	return out
}

// waitEach waits until every id in ids was published, then checks that
// none was published more than once.
func (w *wireDues) waitEach(t *testing.T, ids []string) {
	t.Helper()
	var got map[string]int
	ok := assertEventually(func() bool {
		got = w.snapshot()
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	missing := 0
	for _, id := range ids {
		if got[id] == 0 {
			missing++
		}
	}
	require.True(t, ok, "%d of %d dues never published", missing, len(ids))
	for _, id := range ids {
		require.Equal(t, 1, got[id], "due %s published %d times", id, got[id])
	}
}

// publishAll publishes msgs without waiting for each ack and checks
// every ack (natstest.PublishAll): thousands of facts in about a second.
func publishAll(t *testing.T, b *bundle, msgs []*nats.Msg) {
	t.Helper()
	natstest.PublishAll(t, b.ctx, b.js, msgs)
}
