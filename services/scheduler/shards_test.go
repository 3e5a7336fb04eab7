package scheduler_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// Two shards, each on a Postgres server of its own, on one NATS server
// whose RETRIES is split in two. Thousands of items of two kinds fail:
// each comes due exactly once, from the shard contract.Shard names and
// from nowhere else, its row lives in that shard's database only, and
// its succeeded closes that row. One release fact, stored on one shard's
// token, releases the held items of its kind and key on both shards.
func TestTwoShardsEndToEnd(t *testing.T) {
	t.Parallel()
	s := splitSetup(t, ownClusterPool)
	for _, kind := range shardKinds {
		s.policy(t, kind, 10)
	}
	wire := countWireDues(t, s[0].nc)
	s.start(t)

	const perKind = 1500
	var items []shardItem
	var fails []*nats.Msg
	var dues []string
	want := [2]map[string]retrystore.State{{}, {}}
	perShard := map[string]int{}
	for _, kind := range shardKinds {
		for i := range perKind {
			it := shardItem{kind: kind, id: fmt.Sprintf("it-%04d", i)}
			it.shard = contract.Shard(kind, it.id, 2)
			items = append(items, it)
			fails = append(fails, lifecycleMsg(t, contract.Failed, failed(kind, it.id, 1, "timeout")))
			dues = append(dues, contract.DueMsgID(kind, it.id, 2))
			want[it.shard][kind+"/"+it.id] = retrystore.StateDue
			perShard[fmt.Sprintf("%s on %d", kind, it.shard)]++
		}
	}
	require.Len(t, perShard, 4, "each shard owns items of each kind: %v", perShard)
	t.Logf("items per shard: %v", perShard)
	publishAll(t, s[0], fails)

	wire.waitEach(t, dues)
	for k, b := range s {
		b.waitRows(t, want[k], shardKinds...)
	}
	// The stream stored each due under its item's shard token, once.
	stored := natstest.Messages(t, s[0].ctx, s[0].js, contract.StreamRetries, contract.RetryFilter("*", contract.Due))
	requireEachOnce(t, stored, len(dues))
	for _, m := range stored {
		p, err := contract.ParseRetrySubject(m.Subject())
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(contract.Shard(p.Kind, p.ID, 2)), p.Shard, m.Subject())
	}

	var oks []*nats.Msg
	for _, it := range items {
		oks = append(oks, lifecycleMsg(t, contract.Succeeded, contract.SucceededData{Kind: it.kind, ID: it.id, Attempt: 2}))
		want[it.shard][it.kind+"/"+it.id] = retrystore.StateSucceeded
	}
	publishAll(t, s[0], oks)
	for k, b := range s {
		b.waitRows(t, want[k], shardKinds...)
	}

	// Holds of alpha under "shop" on both shards, and one of beta under
	// the same key, which alpha's release must leave held.
	var heldDues []string
	heldOn := [2]int{}
	for i := range 40 {
		hd := heldUnder("shop", "alpha", fmt.Sprintf("h-%02d", i), contract.HoldPause, nil)
		k := contract.Shard("alpha", hd.ID, 2)
		heldOn[k]++
		b := s[k]
		b.publish(t, contract.Held, hd)
		b.waitRow(t, "alpha", hd.ID, inState(retrystore.StateScheduled, 2))
		heldDues = append(heldDues, contract.DueMsgID("alpha", hd.ID, 2))
		want[k]["alpha/"+hd.ID] = retrystore.StateDue
	}
	require.NotZero(t, heldOn[0])
	require.NotZero(t, heldOn[1])
	beta := heldUnder("shop", "beta", "h-beta", contract.HoldPause, nil)
	betaShard := contract.Shard("beta", beta.ID, 2)
	s[betaShard].publish(t, contract.Held, beta)
	s[betaShard].waitRow(t, "beta", beta.ID, inState(retrystore.StateScheduled, 2))
	want[betaShard]["beta/"+beta.ID] = retrystore.StateScheduled

	ack := s[0].publish(t, contract.Released, contract.ReleasedData{Kind: "alpha", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now()})
	release, err := s[0].js.Stream(s[0].ctx, contract.StreamRetries)
	require.NoError(t, err)
	rm, err := release.GetMsg(s[0].ctx, ack.Sequence)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("retry.alpha.released.shop.%d", contract.Shard("alpha", "shop", 2)), rm.Subject,
		"the release is stored on one shard's token; every shard takes it")

	wire.waitEach(t, heldDues)
	for k, b := range s {
		b.waitRows(t, want[k], shardKinds...)
	}
	s.waitQuiet(t)
	got := wire.snapshot()
	require.Len(t, got, len(dues)+len(heldDues), "no other due was published (beta's hold stays)")
	for id, n := range got {
		require.Equal(t, 1, n, id)
	}
}

// On a split stream JetStream still drops a fact published twice inside
// the duplicate window, and stores one republished past it under the
// same shard token: only the owning shard sees it, and its inbox makes
// it a duplicate. A malformed fact is terminated by its owning shard
// alone. A subject of five tokens is no subject of RETRIES: an owner
// cannot choose a shard, nothing is stored.
func TestSplitStreamDuplicateAndMalformedFacts(t *testing.T) {
	t.Parallel()
	s := splitSetup(t, otherDatabasePool)
	b := s[0]
	shrinkDuplicateWindow(t, b, time.Second)
	s.policy(t, "dupk", hourMS)

	ids := [2]string{}
	for i := 0; ids[0] == "" || ids[1] == ""; i++ {
		id := fmt.Sprintf("d%d", i)
		if k := contract.Shard("dupk", id, 2); ids[k] == "" {
			ids[k] = id
		}
	}
	for _, tok := range []string{"0", "1", "2", "x"} {
		msg := lifecycleMsg(t, contract.Failed, failed("dupk", ids[0], 1, "timeout"))
		msg.Subject += "." + tok
		_, err := b.js.PublishMsg(b.ctx, msg, jetstream.WithRetryAttempts(0))
		require.ErrorIs(t, err, jetstream.ErrNoStreamResponse, msg.Subject)
	}
	stream, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	info, err := stream.Info(b.ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "no five-token subject was stored")

	inst := s.start(t)
	for k, id := range ids {
		msg := lifecycleMsg(t, contract.Failed, failed("dupk", id, 1, "timeout"))
		first, third := b.storeTwice(t, msg)
		for _, seq := range []uint64{first.Sequence, third.Sequence} {
			m, err := stream.GetMsg(b.ctx, seq)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("%s.%d", msg.Subject, k), m.Subject)
		}
	}
	bad := ""
	for i := 0; bad == ""; i++ {
		if id := fmt.Sprintf("bad%d", i); contract.Shard("dupk", id, 2) == 1 {
			bad = id
		}
	}
	malformed := lifecycleMsg(t, contract.Failed, failed("dupk", bad, 1, "timeout"))
	malformed.Data = []byte(`{"not":"an envelope"}`)
	_, err = b.js.PublishMsg(b.ctx, malformed)
	require.NoError(t, err)

	for k, id := range ids {
		waitMetric(t, inst[k].reg, 1, "retryd_scheduler_duplicate_total", "consumer", scheduler.Owner)
		s[k].waitRow(t, "dupk", id, inState(retrystore.StateScheduled, 2))
		require.Equal(t, []string{"failed:1", "scheduled:2"}, events(s[k].history(t, "dupk", id)))
	}
	waitMetric(t, inst[1].reg, 1, "retryd_scheduler_malformed_total", "consumer", scheduler.Owner)
	s.waitQuiet(t)
	for k := range s {
		require.Equal(t, map[string]retrystore.State{"dupk/" + ids[k]: retrystore.StateScheduled}, s[k].rows(t, "dupk"),
			"shard %d holds its own item only", k)
		require.Equal(t, 1.0, metric(t, inst[k].reg, "retryd_scheduler_duplicate_total", "consumer", scheduler.Owner))
	}
	require.Zero(t, metric(t, inst[0].reg, "retryd_scheduler_malformed_total", "consumer", scheduler.Owner))
}

// A scheduler whose shard count the stream is not split by a multiple of
// would take no facts, or another shard's: it refuses to start, and
// creates no consumer. A stream split into a multiple of its count (a
// resharding in progress) lets it start.
func TestSchedulerRefusesAShardCountTheStreamIsNotSplitBy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		stream, shards, shard int
		refused               bool
	}{
		{stream: 2, shards: 4, shard: 0, refused: true},
		{stream: 2, shards: 4, shard: 3, refused: true},
		{stream: 2, shards: 3, shard: 1, refused: true},
		{stream: 1, shards: 2, shard: 1, refused: true},
		{stream: 4, shards: 2, shard: 1},
	} {
		t.Run(fmt.Sprintf("stream %d, shard %d of %d", c.stream, c.shard, c.shards), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Storage: jetstream.MemoryStorage, Shards: c.stream}))
			if !c.refused {
				b.start(t, func(cfg *scheduler.Config) { cfg.Shards, cfg.Shard = c.shards, c.shard })
				return
			}
			sch, err := scheduler.New(scheduler.Config{Pool: b.pool, JS: b.js,
				Streams: streams.Options{Storage: jetstream.MemoryStorage}, Shards: c.shards, Shard: c.shard})
			require.NoError(t, err)
			err = sch.Start(b.ctx)
			require.ErrorIs(t, err, scheduler.ErrShards)
			_, err = b.js.Consumer(b.ctx, contract.StreamRetries, scheduler.ConsumerNameOf(c.shard))
			require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "a refused shard creates no consumer")
			stream, err := b.js.Stream(b.ctx, contract.StreamRetries)
			require.NoError(t, err)
			n, ok := streams.StreamShards(stream.CachedInfo().Config)
			require.True(t, ok)
			require.Equal(t, c.stream, n, "the stream keeps its split")
		})
	}
}
