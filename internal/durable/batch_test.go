package durable_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/failpoint"
	"github.com/retryd/retryd/pkg/contract"
)

func batchSpec(name string, batch int, h durable.BatchHandler) durable.Spec {
	return durable.Spec{Stream: contract.StreamJobs, Batch: batch, HandleBatch: h, Config: jetstream.ConsumerConfig{
		Durable: name, FilterSubjects: []string{"jobs." + name}, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, MaxDeliver: -1,
	}}
}

// batches records what a batch handler was handed.
type batches struct {
	mu  sync.Mutex
	got [][]string
}

func (b *batches) add(msgs []jetstream.Msg) {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		ids = append(ids, string(m.Data()))
	}
	b.mu.Lock()
	b.got = append(b.got, ids)
	b.mu.Unlock()
}

func (b *batches) all() (flat []string, sizes []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ids := range b.got {
		flat = append(flat, ids...)
		sizes = append(sizes, len(ids))
	}
	return flat, sizes
}

// What was delivered is handed over in batches of at most Spec.Batch, in
// stream order, and a nil error acks every message.
func TestBatchHandedOverInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []string
	for i := range 30 {
		id := fmt.Sprintf("m%02d", i)
		want = append(want, id)
		b.publish(t, "jobs.order", id)
	}
	var seen batches
	b.start(t, b.config(), batchSpec("order", 8, func(_ context.Context, msgs []jetstream.Msg) error {
		seen.add(msgs)
		return nil
	}))
	b.settled(t, "order")
	got, sizes := seen.all()
	require.Equal(t, want, got, "every message once, in stream order")
	require.LessOrEqual(t, slices.Max(sizes), 8)
	require.Greater(t, slices.Max(sizes), 1, "what was delivered together is handed over together")
}

// Settle settles a batch's message as a Handler's error would settle it
// alone: acked, terminated and counted as malformed, handed back for
// later, handed back as a failure, or left in hand for the batch's error.
func TestSettleByHandlerError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publish(t, "jobs.settle", "ok", "bad", "later", "away", "left")
	var seen calls
	b.start(t, b.config(), batchSpec("settle", 10, func(_ context.Context, msgs []jetstream.Msg) error {
		var leave error
		for _, m := range msgs {
			id := string(m.Data())
			first := seen.add(id) == 1
			var err error
			switch {
			case !first:
			case id == "bad":
				err = fmt.Errorf("%w: no id", contract.ErrInvalid)
			case id == "later":
				err = durable.NakAfter(10 * time.Millisecond)
			case id == "away":
				err = errors.New("database away")
			case id == "left":
				leave = fmt.Errorf("crash: %w", durable.ErrAbandon)
				err = leave
			}
			assert.True(t, durable.Settle(m, err))
		}
		// Leaves "left" (its first delivery) for redelivery; nothing else
		// is unsettled.
		return leave
	}))
	b.settled(t, "settle")
	require.Equal(t, 1, seen.get("ok"))
	require.Equal(t, 1, seen.get("bad"), "terminated")
	require.Equal(t, 2, seen.get("later"), "handed back, then acked")
	require.Equal(t, 2, seen.get("away"), "handed back as a failure, then acked")
	require.Equal(t, 2, seen.get("left"), "left unacked, delivered again after the ack wait")
	require.Equal(t, 1.0, testutil.ToFloat64(b.malformed.WithLabelValues("settle")))
	require.Equal(t, 1.0, testutil.ToFloat64(b.failed.WithLabelValues("settle")))
	require.False(t, durable.Settle(nil, nil), "not a batch message")
}

// The handler settles messages one by one with their own methods; its
// error settles only the ones it left.
func TestBatchSettlesEachMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// "left" precedes "later": the second delivery of "later" never shares
	// a batch with the first of "left".
	b.publish(t, "jobs.each", "acked", "bad", "left", "later")
	var seen calls
	b.start(t, b.config(), batchSpec("each", 10, func(_ context.Context, msgs []jetstream.Msg) error {
		var fail bool
		for _, m := range msgs {
			id := string(m.Data())
			n := seen.add(id)
			switch {
			case id == "acked":
				assert.NoError(t, m.Ack())
			case id == "bad":
				assert.NoError(t, m.TermWithReason("malformed"))
			case id == "later" && n == 1:
				assert.NoError(t, m.NakWithDelay(10*time.Millisecond))
			case id == "left" && n == 1:
				fail = true
			}
		}
		if fail {
			// Hands back what was not settled above: "left".
			return errors.New("database away")
		}
		return nil // acks what is left
	}))
	b.settled(t, "each")
	require.Equal(t, 1, seen.get("acked"), "settled by the handler, not handed back by its error")
	require.Equal(t, 1, seen.get("bad"), "terminated")
	require.Equal(t, 2, seen.get("later"), "handed back by the handler, then acked by its nil error")
	require.Equal(t, 2, seen.get("left"), "handed back by the error")
	require.Equal(t, 1.0, testutil.ToFloat64(b.failed.WithLabelValues("each")), "only what the error settled counts")
	require.Zero(t, testutil.ToFloat64(b.malformed.WithLabelValues("each")), "the handler terminated bad itself")
}

// A handler's error settles what it left as in single mode: malformed is
// terminated and counted, Reject terminated, NakAfter handed back
// without counting a failure, anything else handed back and counted.
func TestBatchHandlerErrorSemantics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Published before the consumer exists: its pending count is exact
	// from the start (b.settled relies on it).
	b.publish(t, "jobs.errs", "ok", "bad", "rejected", "flaky", "early")
	var seen calls
	b.start(t, b.config(), batchSpec("errs", 1, func(_ context.Context, msgs []jetstream.Msg) error {
		id := string(msgs[0].Data())
		return errorFor(id, seen.add(id))
	}))
	b.settled(t, "errs")
	require.Equal(t, 1, seen.get("ok"))
	require.Equal(t, 1, seen.get("bad"))
	require.Equal(t, 1, seen.get("rejected"))
	require.Equal(t, 3, seen.get("flaky"))
	require.Equal(t, 3, seen.get("early"))
	require.Equal(t, 1.0, testutil.ToFloat64(b.malformed.WithLabelValues("errs")))
	require.Equal(t, 2.0, testutil.ToFloat64(b.failed.WithLabelValues("errs")))
}

// A failpoint after the handler's commit abandons the batch: nothing is
// acked or handed back, and JetStream delivers it again after the ack
// wait.
func TestBatchFailpointAbandonsTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publish(t, "jobs.fp", "a", "b", "c")
	fp := failpoint.Func(func(_ context.Context, point string) error {
		return errors.New("process killed after commit")
	})
	var seen calls
	var redelivered sync.Map
	b.start(t, b.config(), batchSpec("fp", 10, func(ctx context.Context, msgs []jetstream.Msg) error {
		// The process dies after committing a batch that holds a first
		// delivery (the three need not come in one batch); what it
		// redelivers is acked.
		var killed error
		for _, m := range msgs {
			seen.add(string(m.Data()))
			if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
				redelivered.Store(string(m.Data()), true)
				assert.NoError(t, m.Ack())
				continue
			}
			// Committed here; the failpoint's error wraps durable.ErrAbandon.
			killed = fp.At(ctx, "test.committed")
		}
		return killed
	}))
	b.settled(t, "fp")
	for _, id := range []string{"a", "b", "c"} {
		require.Equal(t, 2, seen.get(id), "message %s abandoned once, then redelivered", id)
		_, ok := redelivered.Load(id)
		require.True(t, ok, "message %s came back by redelivery", id)
	}
	require.Zero(t, testutil.ToFloat64(b.failed.WithLabelValues("fp")), "an abandoned batch is no failure")
}

// A consumer deleted while its group runs is recreated soon after the
// client reports it deleted (the check interval is an hour here), and
// consumption resumes from the start of the stream.
func TestBatchConsumerDeletedIsRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	cfg := b.config()
	cfg.CheckInterval = time.Hour
	b.start(t, cfg, batchSpec("gone", 10, func(_ context.Context, msgs []jetstream.Msg) error {
		for _, m := range msgs {
			seen.add(string(m.Data()))
		}
		return nil
	}))
	b.publish(t, "jobs.gone", "before")
	// Handled, then acked (a consumer's pending count can lag the publish).
	require.Eventually(t, func() bool { return seen.get("before") == 1 }, wait, 10*time.Millisecond)
	b.settled(t, "gone")
	require.NoError(t, b.js.DeleteConsumer(context.Background(), contract.StreamJobs, "gone"))
	b.publish(t, "jobs.gone", "after")
	require.Eventually(t, func() bool { return seen.get("after") == 1 }, wait, 10*time.Millisecond)
	b.settled(t, "gone")
	require.Equal(t, 2, seen.get("before"), "the recreated consumer starts at the stream's start")
}

// A slow batch is kept from redelivery by in-progress acks every
// Spec.Progress, though it takes longer than the ack wait.
func TestBatchInProgressKeepsASlowBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	progress := prometheus.NewCounter(prometheus.CounterOpts{Name: "in_progress_total"})
	var seen calls
	spec := batchSpec("slow", 10, func(ctx context.Context, msgs []jetstream.Msg) error {
		for _, m := range msgs {
			seen.add(string(m.Data()))
		}
		// Held for well over the 1s ack wait: six in-progress acks.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(wait)
		for testutil.ToFloat64(progress) < 6 && time.Now().Before(deadline) {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	spec.Progress, spec.InProgress = 250*time.Millisecond, progress
	b.start(t, b.config(), spec)
	b.publish(t, "jobs.slow", "one")
	require.Eventually(t, func() bool { return seen.get("one") == 1 }, wait, 10*time.Millisecond)
	b.settled(t, "slow")
	require.GreaterOrEqual(t, testutil.ToFloat64(progress), 6.0)
	require.Equal(t, 1, seen.get("one"), "never redelivered")
}

// Drain hands over what was queued and waits for the batch in hand.
func TestBatchDrainHandlesWhatWasDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var seen calls
	g := b.start(t, b.config(), batchSpec("drain", 1, func(_ context.Context, msgs []jetstream.Msg) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		seen.add(string(msgs[0].Data()))
		return nil
	}))
	b.publish(t, "jobs.drain", "one", "two", "three")
	<-started
	drained := make(chan error, 1)
	go func() { drained <- g.Drain(context.Background()) }()
	close(release)
	require.NoError(t, <-drained)
	require.Equal(t, 1, seen.get("one"))
	// Whatever was delivered was handled and acked; what was not stays in
	// the stream for the next process.
	c, err := b.js.Consumer(context.Background(), contract.StreamJobs, "drain")
	require.NoError(t, err)
	// The last ack may still be on its way.
	require.Eventually(t, func() bool {
		info, err := c.Info(context.Background())
		require.NoError(t, err)
		return info.NumAckPending == 0 && int(info.AckFloor.Consumer) == seen.get("one")+seen.get("two")+seen.get("three")
	}, wait, 10*time.Millisecond, "whatever was delivered was handled and acked")
}

func TestBatchConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := func(context.Context, jetstream.Msg) error { return nil }
	bh := func(context.Context, []jetstream.Msg) error { return nil }
	both := batchSpec("a", 1, bh)
	both.Handle = h
	single := spec("a", h)
	single.Batch = 10
	for _, tc := range []struct {
		spec durable.Spec
		want string
	}{
		{both, "Spec[0]: Handle and HandleBatch are both set"},
		{single, "for HandleBatch only"},
		{batchSpec("a", -1, bh), "Spec[0].Batch"},
		{batchSpec("a", 10_001, bh), "Spec[0].Batch"},
	} {
		_, err := durable.NewGroup(b.config(), tc.spec)
		require.ErrorContains(t, err, tc.want)
	}
	slow := batchSpec("a", 1, bh)
	slow.Progress = -time.Second
	_, err := durable.NewGroup(b.config(), slow)
	require.ErrorContains(t, err, "Spec[0].Progress")
}
