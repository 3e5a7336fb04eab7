package shards_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/shards"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const waitFor = 60 * time.Second

var memory = streams.Options{Storage: jetstream.MemoryStorage}

type env struct {
	ctx   context.Context
	js    jetstream.JetStream
	urls  []string
	pools []*pgxpool.Pool
}

func newEnv(t *testing.T, dbs int) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	e := &env{ctx: ctx, js: js}
	for range dbs {
		u := pgtest.NewDatabaseURL(t)
		pool, err := pgxpool.New(ctx, u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		e.urls, e.pools = append(e.urls, u), append(e.pools, pool)
	}
	return e
}

// start starts the scheduler of shard of shards on its database.
func (e *env) start(t *testing.T, shard, shards int) *scheduler.Scheduler {
	t.Helper()
	s, err := scheduler.New(scheduler.Config{
		Pool: e.pools[shard], JS: e.js, Logger: servicetest.Logger(t), Registerer: prometheus.NewRegistry(),
		MaxIdle: 200 * time.Millisecond, AckWait: 2 * time.Second, MetricsInterval: 100 * time.Millisecond,
		Streams: memory, Shard: shard, Shards: shards,
	})
	require.NoError(t, err)
	require.NoError(t, s.Start(e.ctx))
	t.Cleanup(func() { e.stop(t, s) })
	return s
}

func (e *env) stop(t *testing.T, s *scheduler.Scheduler) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, s.Stop(ctx))
}

func (e *env) fail(t *testing.T, id, jobType string, attempt int) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test/owner", contract.Failed, contract.FailedData{
		Kind: contract.KindJob, ID: id, Attempt: attempt, JobType: jobType, Payload: []byte(`{"b": 1, "a": [2]}`),
		Error: contract.ErrorInfo{Class: "network", Message: "boom"},
	}, time.Now())
	require.NoError(t, err)
	_, err = e.js.PublishMsg(e.ctx, msg)
	require.NoError(t, err)
}

func (e *env) waitRow(t *testing.T, shard int, id string, cond func(retrystore.Retry) bool) retrystore.Retry {
	t.Helper()
	var got retrystore.Retry
	require.Eventually(t, func() bool {
		r, err := retrystore.Get(e.ctx, e.pools[shard], contract.KindJob, id)
		got = r
		return err == nil && cond(r)
	}, waitFor, 20*time.Millisecond, "row %s on shard %d", id, shard)
	return got
}

// dues counts the due events RETRIES stores per Nats-Msg-Id.
func (e *env) dues(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range natstest.Messages(t, e.ctx, e.js, contract.StreamRetries, contract.RetryFilter(contract.KindJob, contract.Due)) {
		out[m.Headers().Get(contract.HeaderMsgID)]++
	}
	return out
}

// policies stores the test's policies on the given shards' databases
// (shard 0's by default): each shard decides by its own.
func (e *env) policies(t *testing.T, on ...int) {
	t.Helper()
	if len(on) == 0 {
		on = []int{0}
	}
	for _, k := range on {
		e.policiesOn(t, k)
	}
}

func (e *env) policiesOn(t *testing.T, shard int) {
	t.Helper()
	for jobType, base := range map[string]int64{"soon": 1500, "later": 6000} {
		_, err := retrystore.PutPolicy(e.ctx, e.pools[shard], policy.Policy{
			Kind: contract.KindJob, JobType: jobType, Name: jobType, MaxRetries: 5, Enabled: true,
			Backoff: backoff.Config{Base: policy.FromMS(base), Multiplier: 2, Max: policy.FromMS(base * 4), Jitter: backoff.JitterNone},
		}, "test")
		require.NoError(t, err)
	}
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("item-%03d", i)
	}
	return out
}

func jobTypeOf(i int) string {
	if i%2 == 0 {
		return "soon"
	}
	return "later"
}

// Items pending on one unsplit shard while it is split into two, with
// its scheduler running: each comes due exactly once, on the shard that
// owns it after, and the new shard decides the next failure of an item
// it took over. The move is stopped between a batch's two commits (as a
// crash would) and finished by a rerun; a rerun after that moves nothing.
func TestSplitOneIntoTwo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.policies(t)
	old := e.start(t, 0, 1)
	items := ids(40)
	moving := 0
	for i, id := range items {
		e.fail(t, id, jobTypeOf(i), 1)
		if contract.Shard(contract.KindJob, id, 2) == 1 {
			moving++
		}
	}
	require.Greater(t, moving, 5)
	for _, id := range items {
		e.waitRow(t, 0, id, func(r retrystore.Retry) bool { return r.Attempt == 2 })
	}

	log := zerolog.New(zerolog.NewTestWriter(t))
	opts := shards.SplitOptions{To: 2, URLs: e.urls, Streams: memory, Batch: 4, Log: log, Poll: 50 * time.Millisecond}
	crashed := opts
	crashed.Hook = func(from, to int) error { return shards.ErrAbort }
	_, err := shards.Split(e.ctx, e.js, crashed)
	require.ErrorIs(t, err, shards.ErrAbort)
	both := 0
	for _, id := range items {
		_, err0 := retrystore.Get(e.ctx, e.pools[0], contract.KindJob, id)
		_, err1 := retrystore.Get(e.ctx, e.pools[1], contract.KindJob, id)
		if err0 == nil && err1 == nil {
			both++
		}
	}
	require.Equal(t, 4, both, "the crash left the first batch on both shards")

	src, err := pgx.Connect(e.ctx, e.urls[0])
	require.NoError(t, err)
	defer src.Close(context.Background())
	_, err = shards.Move{From: 0, Source: src, Shards: 2, Batch: 4, Log: log, Running: map[int]uint64{1: 7}}.Run(e.ctx)
	require.ErrorIs(t, err, shards.ErrShardRunning, "no row moves into a shard whose scheduler started")

	_, err = shards.Split(e.ctx, e.js, opts)
	require.ErrorIs(t, err, shards.ErrLayout, "once split, a rerun names the old count")
	opts.From = 1
	rep, err := shards.Split(e.ctx, e.js, opts)
	require.NoError(t, err)
	require.False(t, rep.Split)
	require.Equal(t, []shards.Moved{{From: 0, To: 1, Items: moving}}, rep.Moved, "the rerun moves the crashed batch again")
	again, err := shards.Split(e.ctx, e.js, opts)
	require.NoError(t, err)
	require.Empty(t, again.Moved, "a rerun after completion moves nothing")

	st, err := shards.ReadStatus(e.ctx, e.js, e.urls)
	require.NoError(t, err)
	require.Equal(t, 2, st.Shards)
	require.Equal(t, int64(len(items)-moving), st.PerShard[0].Rows.Total)
	require.Equal(t, int64(moving), st.PerShard[1].Rows.Total)
	require.Zero(t, st.PerShard[0].Rows.Elsewhere+st.PerShard[1].Rows.Elsewhere)
	require.False(t, st.PerShard[1].Exists)

	// Facts stored on the new layout while the old scheduler still runs:
	// shard 0's reach it (its consumer took the new layout's filters),
	// shard 1's wait for shard 1.
	fresh := map[int]string{}
	for i := 0; len(fresh) < 2; i++ {
		id := fmt.Sprintf("fresh-%03d", i)
		if _, ok := fresh[contract.Shard(contract.KindJob, id, 2)]; !ok {
			fresh[contract.Shard(contract.KindJob, id, 2)] = id
		}
	}
	e.fail(t, fresh[1], "soon", 1)
	e.fail(t, fresh[0], "soon", 1)
	e.waitRow(t, 0, fresh[0], func(r retrystore.Retry) bool { return r.Attempt == 2 })
	_, err = retrystore.Get(e.ctx, e.pools[0], contract.KindJob, fresh[1])
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	items = append(items, fresh[0], fresh[1])

	e.stop(t, old)
	e.start(t, 0, 2)
	e.start(t, 1, 2)

	e.requireEachDueOnce(t, items)
	var moved string
	for _, id := range items {
		own := contract.Shard(contract.KindJob, id, 2)
		r := e.waitRow(t, own, id, func(r retrystore.Retry) bool { return r.State == retrystore.StateDue })
		require.JSONEq(t, `{"b": 1, "a": [2]}`, string(r.Payload))
		_, err := retrystore.Get(e.ctx, e.pools[1-own], contract.KindJob, id)
		require.ErrorIs(t, err, pgdb.ErrNotFound, id)
		if own == 1 {
			moved = id
		}
	}

	rerun, err := shards.Split(e.ctx, e.js, opts)
	require.NoError(t, err, "a rerun with every shard running moves nothing")
	require.Empty(t, rerun.Moved)

	e.fail(t, moved, "later", 2)
	r := e.waitRow(t, 1, moved, func(r retrystore.Retry) bool { return r.Attempt == 3 && r.State == retrystore.StateScheduled })
	require.Equal(t, "later", r.PolicyName, "the new shard has the old shard's policies")
	h, err := retrystore.History(e.ctx, e.pools[1], contract.KindJob, moved)
	require.NoError(t, err)
	var evs []string
	for _, x := range h {
		evs = append(evs, fmt.Sprintf("%s:%d", x.Event, x.Attempt))
	}
	require.Equal(t, "failed:1", evs[0], "the history moved with the item: %v", evs)
	require.Contains(t, evs, "failed:2")
}

func TestLayout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		have, from, to, urls int
		want                 string
	}{
		{1, 0, 3, 3, ""}, {2, 0, 4, 4, ""}, {4, 2, 4, 4, ""},
		{2, 0, 3, 3, "--to"}, {2, 0, 2, 2, "give --from"}, {2, 0, 1, 1, "--to"},
		{1, 0, 2, 1, "--database-url"}, {4, 1, 2, 2, "neither"}, {1, -1, 2, 2, "--from"},
	} {
		_, err := shards.Layout(tc.have, tc.from, tc.to, tc.urls)
		if tc.want == "" {
			require.NoError(t, err, "%+v", tc)
			continue
		}
		require.ErrorContains(t, err, tc.want, "%+v", tc)
		require.True(t, errors.Is(err, shards.ErrLayout))
	}
}

// Two running shards split into four in one step: each item stays or
// moves to shard s+2, and comes due once on the shard that owns it.
func TestSplitTwoIntoFour(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.policies(t, 0, 1)
	require.NoError(t, streams.Ensure(e.ctx, e.js, streams.Options{Storage: jetstream.MemoryStorage, Shards: 2}))
	olds := []*scheduler.Scheduler{e.start(t, 0, 2), e.start(t, 1, 2)}
	items := ids(40)
	want := map[shards.Moved]int{}
	for i, id := range items {
		e.fail(t, id, jobTypeOf(i), 1)
		from, to := contract.Shard(contract.KindJob, id, 2), contract.Shard(contract.KindJob, id, 4)
		require.True(t, to == from || to == from+2)
		if to != from {
			want[shards.Moved{From: from, To: to}]++
		}
	}
	for _, id := range items {
		e.waitRow(t, contract.Shard(contract.KindJob, id, 2), id, func(r retrystore.Retry) bool { return r.Attempt == 2 })
	}
	_, err := shards.Split(e.ctx, e.js, shards.SplitOptions{To: 4, URLs: e.urls[:3], Streams: memory})
	require.ErrorIs(t, err, shards.ErrLayout, "one database per shard of the new count")

	rep, err := shards.Split(e.ctx, e.js, shards.SplitOptions{To: 4, URLs: e.urls, Streams: memory, Batch: 3,
		Log: zerolog.New(zerolog.NewTestWriter(t)), Poll: 50 * time.Millisecond})
	require.NoError(t, err)
	require.True(t, rep.Split)
	require.Equal(t, 2, rep.From)
	got := map[shards.Moved]int{}
	for _, m := range rep.Moved {
		got[shards.Moved{From: m.From, To: m.To}] = m.Items
	}
	require.Equal(t, want, got)

	for _, s := range olds {
		e.stop(t, s)
	}
	for k := range 4 {
		e.start(t, k, 4)
	}
	e.requireEachDueOnce(t, items)
	for _, id := range items {
		own := contract.Shard(contract.KindJob, id, 4)
		for k := range 4 {
			_, err := retrystore.Get(e.ctx, e.pools[k], contract.KindJob, id)
			if k == own {
				require.NoError(t, err, id)
			} else {
				require.ErrorIs(t, err, pgdb.ErrNotFound, "%s on shard %d", id, k)
			}
		}
	}
}

// requireEachDueOnce waits until every item's attempt 2 came due and
// checks each came due once, and nothing else did.
func (e *env) requireEachDueOnce(t *testing.T, items []string) {
	t.Helper()
	require.Eventually(t, func() bool {
		d := e.dues(t)
		for _, id := range items {
			if d[contract.DueMsgID(contract.KindJob, id, 2)] == 0 {
				return false
			}
		}
		return true
	}, waitFor, 100*time.Millisecond, "every item comes due")
	d := e.dues(t)
	require.Len(t, d, len(items), "one due per item, none of another attempt")
	for _, id := range items {
		require.Equal(t, 1, d[contract.DueMsgID(contract.KindJob, id, 2)], id)
	}
}

// A RETRIES stream whose subject transform retryd did not write has no
// shard count to trust: a split and the status refuse it rather than
// read it as one shard.
func TestForeignTransformIsALayoutError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	_, err := e.js.CreateStream(e.ctx, jetstream.StreamConfig{
		Name: contract.StreamRetries, Subjects: []string{"retry.>"}, Storage: jetstream.MemoryStorage,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "retry.>", Destination: "retry.moved.>"},
	})
	require.NoError(t, err)
	_, err = shards.Split(e.ctx, e.js, shards.SplitOptions{To: 2, URLs: []string{"a", "b"}, Streams: memory})
	require.ErrorIs(t, err, shards.ErrLayout)
	require.ErrorContains(t, err, "did not write")
	_, err = shards.ReadStatus(e.ctx, e.js, nil)
	require.ErrorIs(t, err, shards.ErrLayout)
	require.ErrorContains(t, err, "did not write")
}
