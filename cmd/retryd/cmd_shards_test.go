package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/retrystore"
	schedulersvc "github.com/retryd/retryd/services/scheduler"
)

// startShard starts the scheduler of shard of shards on pool; stop stops
// it (and is called at the end of the test if not before).
func startShard(t *testing.T, be backendtest.Backends, pool *pgxpool.Pool, shard, shards int) (stop func()) {
	t.Helper()
	s, err := schedulersvc.New(schedulersvc.Config{Pool: pool, JS: be.JS, Logger: testLogger(t), Registerer: prometheus.NewRegistry(),
		MaxIdle: 100 * time.Millisecond, Shards: shards, Shard: shard})
	require.NoError(t, err)
	require.NoError(t, s.Start(be.Ctx))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, s.Stop(ctx))
		})
	}
	t.Cleanup(stop)
	return stop
}

func failJob(t *testing.T, be backendtest.Backends, id string, attempt int, after time.Duration) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test/owner", contract.Failed, contract.FailedData{Kind: contract.KindJob, ID: id, Attempt: attempt,
		JobType: "split", Error: contract.ErrorInfo{Class: "network", Message: "reset"}, RetryAfter: contract.RetryAfterDuration(after)}, time.Now())
	require.NoError(t, err)
	_, err = be.JS.PublishMsg(be.Ctx, msg)
	require.NoError(t, err)
}

// Resharding 1 to 2 under a running scheduler: `retryd shards split`
// splits RETRIES, waits for the running shard to apply what was stored
// before, and moves the items of shard 1 with their history. Then the
// new shard starts and the old one restarts with the new count: every
// pending item comes due exactly once, each from the database of its
// shard, and a later failure of a moved item is decided by its new shard.
func TestShardsSplitOneToTwo(t *testing.T) {
	t.Parallel()
	be := backendtest.Start(t, 3*time.Minute)
	url0, url1 := be.Pool.Config().ConnString(), pgtest.NewDatabaseURL(t)
	pool1, err := pgxpool.New(be.Ctx, url1)
	require.NoError(t, err)
	t.Cleanup(pool1.Close)
	require.NoError(t, streams.Ensure(be.Ctx, be.JS, streams.Options{}))

	var mu sync.Mutex
	dues := map[string]int{} // Nats-Msg-Id -> deliveries seen on the wire
	sub, err := be.NC.Subscribe(contract.RetryUnsplitFilter(contract.KindJob, contract.Due), func(m *nats.Msg) {
		mu.Lock()
		dues[m.Header.Get(nats.MsgIdHdr)]++
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	stopOld := startShard(t, be, be.Pool, 0, 1)
	const n = 60
	ids := make([]string, n)
	var moving []string
	for i := range ids {
		ids[i] = fmt.Sprintf("01JSPLIT%04d", i)
		after := 2 * time.Second // due around the split
		if i%2 == 1 {
			after = 6 * time.Second // due after it
		}
		failJob(t, be, ids[i], 1, after)
		if contract.Shard(contract.KindJob, ids[i], 2) == 1 {
			moving = append(moving, ids[i])
		}
	}
	require.NotEmpty(t, moving)
	require.Eventually(t, func() bool {
		var c int
		require.NoError(t, be.Pool.QueryRow(be.Ctx, `SELECT count(*) FROM retries WHERE kind = 'job'`).Scan(&c))
		return c == n
	}, 30*time.Second, 20*time.Millisecond)

	bad := cli(t, "shards", "split", "--to", "3", "--database-url", url0, "--database-url", url1, "--nats-url", be.Srv.ClientURL())
	require.Equal(t, exitUsage, bad.code, bad.stderr)
	require.Contains(t, bad.stderr, "--database-url is given 2 times for --to 3")

	r := cli(t, "--json", "shards", "split", "--to", "2", "--database-url", url0, "--database-url", url1, "--nats-url", be.Srv.ClientURL())
	require.Equal(t, exitOK, r.code, r.stderr)
	var res splitResult
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	require.Equal(t, int64(len(moving)), res.Rows)
	require.Equal(t, int64(len(moving)), res.Moved["0->1"])

	// Rows are where their shard says, each once.
	for _, id := range ids {
		k := contract.Shard(contract.KindJob, id, 2)
		_, err := retrystore.Get(be.Ctx, []*pgxpool.Pool{be.Pool, pool1}[k], contract.KindJob, id)
		require.NoError(t, err, "%s on shard %d", id, k)
		_, err = retrystore.Get(be.Ctx, []*pgxpool.Pool{be.Pool, pool1}[1-k], contract.KindJob, id)
		require.Error(t, err, "%s not on shard %d", id, 1-k)
	}
	again := cli(t, "--json", "shards", "split", "--to", "2", "--from", "1", "--database-url", url0, "--database-url", url1, "--nats-url", be.Srv.ClientURL())
	require.Equal(t, exitOK, again.code, again.stderr)
	require.NoError(t, json.Unmarshal([]byte(again.stdout), &res))
	require.Zero(t, res.Rows, "a resumed split with nothing left moves nothing")

	stopOld()
	startShard(t, be, be.Pool, 0, 2)
	startShard(t, be, pool1, 1, 2)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if dues[contract.DueMsgID(contract.KindJob, id, 2)] == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "every item comes due")
	// The next failure of a moved item is its new shard's to decide.
	failJob(t, be, moving[0], 2, time.Hour)
	require.Eventually(t, func() bool {
		row, err := retrystore.Get(be.Ctx, pool1, contract.KindJob, moving[0])
		return err == nil && row.Attempt == 3 && row.State == retrystore.StateScheduled
	}, 30*time.Second, 20*time.Millisecond)
	_, err = retrystore.Get(be.Ctx, be.Pool, contract.KindJob, moving[0])
	require.Error(t, err)

	st := cli(t, "--json", "shards", "status", "--database-url", url0, "--database-url", url1, "--nats-url", be.Srv.ClientURL())
	require.Equal(t, exitOK, st.code, st.stderr)
	var status shardsStatus
	require.NoError(t, json.Unmarshal([]byte(st.stdout), &status))
	require.Equal(t, 2, status.StreamShards)
	require.Equal(t, []int64{0, 0}, status.Misplaced)
	require.Equal(t, int64(n), status.Rows[0]+status.Rows[1])

	// Checked last, after the steps above gave a second emission time to
	// show: each item came due once, from one shard.
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, dues[contract.DueMsgID(contract.KindJob, id, 2)], "%s comes due exactly once", id)
	}
}
