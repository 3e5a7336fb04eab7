package durable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

const wait = 15 * time.Second

type bundle struct {
	js        jetstream.JetStream
	malformed *prometheus.CounterVec
	failed    *prometheus.CounterVec
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	return &bundle{
		js:        js,
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "malformed_total"}, []string{"consumer"}),
		failed:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "failed_total"}, []string{"consumer"}),
	}
}

func (b *bundle) config() durable.Config {
	return durable.Config{
		JS: b.js, Logger: zerolog.Nop(), Malformed: b.malformed, Failed: b.failed,
		NakDelay: func(uint64) time.Duration { return 10 * time.Millisecond },
	}
}

func spec(name string, h durable.Handler) durable.Spec {
	return durable.Spec{Stream: contract.StreamJobs, Workers: 2, Handle: h, Config: jetstream.ConsumerConfig{
		Durable: name, FilterSubjects: []string{"jobs." + name}, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, MaxDeliver: -1,
	}}
}

func (b *bundle) start(t *testing.T, cfg durable.Config, specs ...durable.Spec) *durable.Group {
	t.Helper()
	g, err := durable.NewGroup(cfg, specs...)
	require.NoError(t, err)
	require.NoError(t, g.Start(context.Background()))
	t.Cleanup(func() { _ = g.Drain(context.Background()) })
	return g
}

// publish publishes a message on subject for each id, in order, the id
// its body and its Nats-Msg-Id.
func (b *bundle) publish(t *testing.T, subject string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		msg := nats.NewMsg(subject)
		msg.Data = []byte(id)
		msg.Header.Set(contract.HeaderMsgID, id)
		_, err := b.js.PublishMsg(context.Background(), msg)
		require.NoError(t, err)
	}
}

// settled waits until the consumer has nothing pending or unacked.
func (b *bundle) settled(t *testing.T, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := b.js.Consumer(context.Background(), contract.StreamJobs, name)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, wait, 10*time.Millisecond, "consumer %s did not settle", name)
}

// calls counts handler calls per message body.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// errorFor is what the handlers of the settling tests, single and batch,
// return for message id on its nth delivery: bad, huge and rejected fail
// every time (they are terminated), flaky and early twice, abandoned
// once; anything else works. Both modes must settle each alike.
func errorFor(id string, n int) error {
	switch {
	case id == "bad":
		return fmt.Errorf("decode: %w", contract.ErrInvalid)
	case id == "huge":
		return fmt.Errorf("decode: %w", contract.ErrTooLarge)
	case id == "rejected":
		return durable.Reject(errors.New("type not allowed"))
	case id == "flaky" && n < 3:
		return errors.New("database away")
	case id == "abandoned" && n == 1:
		return fmt.Errorf("failpoint: %w", durable.ErrAbandon)
	case id == "early" && n < 3:
		return durable.NakAfter(10 * time.Millisecond)
	}
	return nil
}

// The handler's error settles the message: ack, term (counted as
// malformed or not), nak for a later delivery, or nothing (abandoned).
func TestHandlerErrorSettlesTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Published before the consumer exists: its pending count is exact
	// from the start (b.settled relies on it). Published after, a poll
	// of the consumer's info could read it settled before it had counted
	// them (seen once under load: "ok" never delivered).
	b.publish(t, "jobs.settle", "ok", "bad", "huge", "rejected", "flaky", "abandoned", "early")
	var seen calls
	b.start(t, b.config(), spec("settle", func(_ context.Context, msg jetstream.Msg) error {
		id := string(msg.Data())
		return errorFor(id, seen.add(id))
	}))
	b.settled(t, "settle")
	require.Equal(t, 1, seen.get("ok"))
	require.Equal(t, 1, seen.get("bad"), "terminated, never delivered again")
	require.Equal(t, 1, seen.get("huge"))
	require.Equal(t, 1, seen.get("rejected"))
	require.Equal(t, 3, seen.get("flaky"), "handed back until it worked")
	require.Equal(t, 2, seen.get("abandoned"), "redelivered after the ack wait")
	require.Equal(t, 3, seen.get("early"), "handed back until it could be applied")
	require.Equal(t, 2.0, testutil.ToFloat64(b.malformed.WithLabelValues("settle")), "rejections are not malformed")
	require.Equal(t, 2.0, testutil.ToFloat64(b.failed.WithLabelValues("settle")), "NakAfter is not a failure")
}

// A deleted consumer is created again and goes on consuming; so is one
// whose stream was deleted, with the stream when Config.Streams allows.
func TestDeletedConsumersAndStreamsAreRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	h := func(_ context.Context, msg jetstream.Msg) error {
		seen.add(string(msg.Data()))
		return nil
	}
	cfg := b.config()
	cfg.CheckInterval = 50 * time.Millisecond
	cfg.Streams = &streams.Options{}
	g := b.start(t, cfg, spec("kept", h))
	b.publish(t, "jobs.kept", "before")
	b.settled(t, "kept")

	require.NoError(t, b.js.DeleteConsumer(context.Background(), contract.StreamJobs, "kept"))
	b.publish(t, "jobs.kept", "while-deleted")
	require.Eventually(t, func() bool { return seen.get("while-deleted") == 1 }, wait, 10*time.Millisecond)
	b.settled(t, "kept")

	require.NoError(t, b.js.DeleteStream(context.Background(), contract.StreamJobs))
	require.Eventually(t, func() bool {
		_, err := b.js.Consumer(context.Background(), contract.StreamJobs, "kept")
		return err == nil
	}, wait, 10*time.Millisecond, "stream and consumer recreated")
	b.publish(t, "jobs.kept", "after-stream")
	require.Eventually(t, func() bool { return seen.get("after-stream") == 1 }, wait, 10*time.Millisecond)
	require.NoError(t, g.Ensure(context.Background()), "nothing is missing any more")
}

// Without Config.Streams a missing stream is reported, not created; the
// consumer comes back once someone else recreates the stream.
func TestMissingStreamIsLeftToTheOperator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	cfg := b.config()
	cfg.CheckInterval = time.Hour
	g := b.start(t, cfg, spec("op", func(_ context.Context, msg jetstream.Msg) error {
		seen.add(string(msg.Data()))
		return nil
	}))
	require.NoError(t, b.js.DeleteStream(context.Background(), contract.StreamJobs))
	require.ErrorContains(t, g.Ensure(context.Background()), "stream JOBS is missing")
	_, err := b.js.Stream(context.Background(), contract.StreamJobs)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)

	natstest.EnsureStreams(t, b.js)
	require.NoError(t, g.Ensure(context.Background()))
	b.publish(t, "jobs.op", "back")
	require.Eventually(t, func() bool { return seen.get("back") == 1 }, wait, 10*time.Millisecond)
}

// Drain waits for the handlers in flight and settles their messages; a
// drain that runs out of time cancels them instead, and their messages
// come back.
func TestDrainWaitsForHandlersOrCancelsThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var finished atomic.Bool
	g := b.start(t, b.config(), spec("slow", func(ctx context.Context, _ jetstream.Msg) error {
		started <- struct{}{}
		select {
		case <-release:
			finished.Store(true)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	b.publish(t, "jobs.slow", "one")
	<-started
	drained := make(chan error, 1)
	go func() { drained <- g.Drain(context.Background()) }()
	select {
	case err := <-drained:
		t.Fatalf("Drain returned while a handler was running: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-drained)
	require.True(t, finished.Load())
	b.settled(t, "slow")
	require.NoError(t, g.Drain(context.Background()), "Drain is idempotent")
	require.ErrorIs(t, g.Start(context.Background()), durable.ErrStopped)

	// A drain out of time cancels the handler; the message is not acked.
	var cancelled atomic.Bool
	g2 := b.start(t, b.config(), spec("stuck", func(ctx context.Context, _ jetstream.Msg) error {
		started <- struct{}{}
		<-ctx.Done()
		cancelled.Store(true)
		return ctx.Err()
	}))
	b.publish(t, "jobs.stuck", "two")
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, g2.Drain(ctx), context.DeadlineExceeded)
	require.True(t, cancelled.Load(), "Drain returns after the cancelled handler did")
	c, err := b.js.Consumer(context.Background(), contract.StreamJobs, "stuck")
	require.NoError(t, err)
	info, err := c.Info(context.Background())
	require.NoError(t, err)
	require.Zero(t, info.AckFloor.Consumer, "the message was not acked")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	h := func(context.Context, jetstream.Msg) error { return nil }
	_, err := durable.NewGroup(durable.Config{}, spec("a", h))
	require.ErrorContains(t, err, "Config.JS is required")
	b := setup(t)
	for _, tc := range []struct {
		specs []durable.Spec
		want  string
	}{
		{nil, "no consumers"},
		{[]durable.Spec{{Stream: "JOBS", Handle: h}}, "Spec[0].Config.Durable is required"},
		{[]durable.Spec{{Config: jetstream.ConsumerConfig{Durable: "x"}, Handle: h}}, "Spec[0].Stream is required"},
		{[]durable.Spec{spec("a", nil)}, "Spec[0].Handle is required (or Spec[0].HandleBatch)"},
		{[]durable.Spec{spec("a", h), spec("a", h)}, "listed twice"},
	} {
		_, err := durable.NewGroup(b.config(), tc.specs...)
		require.ErrorContains(t, err, tc.want)
	}
	cfg := b.config()
	cfg.CheckInterval = -time.Second
	_, err = durable.NewGroup(cfg, spec("a", h))
	require.ErrorContains(t, err, "Config.CheckInterval")
}
