package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream NakWithDelay is what a NATS user writes without retryd: the
// consumer naks a failed message with the backoff delay and JetStream
// redelivers it then. The pending retry lives in the consumer's state (in
// the server's memory and its store), not in a database.

const nakStream = "BENCH_NAK"

func nakStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:      nakStream,
		Subjects:  []string{"nak.>"},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
	}
}

// withMetadata adapts a handler that needs a delivery's metadata and
// when it arrived; a message without metadata is terminated.
func withMetadata(h func(m jetstream.Msg, md *jetstream.MsgMetadata, now time.Time)) func(jetstream.Msg) {
	return func(m jetstream.Msg) {
		now := time.Now()
		md, err := m.Metadata()
		if err != nil {
			_ = m.Term()
			return
		}
		h(m, md, now)
	}
}

func nakDurability(sync natsSync) string { return "NATS " + sync.String() }

func unixNanoBytes(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano()))
}

func bytesUnixNano(b []byte) time.Time {
	if len(b) < 8 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b)))
}

// nakCycles: a message is one item; its first delivery fails and is naked
// with a 100 ms delay, the second is acked (a cycle) and replaced by a new
// message. The ack is sent the way nats.go's Ack does it, without waiting
// for the server to confirm it.
func nakCycles(ctx context.Context, env Env, window int, warmup, dur time.Duration) (cycleResult, error) {
	ns, pub, stopNATS, err := startNATSPeer(ctx, env.NATSSync, nakStreamConfig(), "bench-nak-producer")
	if err != nil {
		return cycleResult{}, err
	}
	defer stopNATS()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	meter := newCycleMeter(window, warmup, dur)
	newItem := func() error {
		msg := nats.NewMsg("nak.work")
		msg.Data = unixNanoBytes(time.Now())
		return pub.publish(runCtx, msg, nil)
	}
	replenish := make(chan struct{}, 4*window)
	stop, err := consume(ctx, ns.js, nakStream, jetstream.ConsumerConfig{
		Durable: "nak-worker", MaxAckPending: 4 * window, AckWait: 30 * time.Second,
	}, withMetadata(func(m jetstream.Msg, md *jetstream.MsgMetadata, _ time.Time) {
		if md.NumDelivered == 1 {
			_ = m.NakWithDelay(cycleDelay)
			return
		}
		_ = m.Ack()
		meter.done(bytesUnixNano(m.Data()))
		replenish <- struct{}{}
	}))
	if err != nil {
		return cycleResult{}, err
	}
	defer stop()
	if err := meter.drive(runCtx, window, replenish, make(chan error, 1), newItem); err != nil {
		return cycleResult{}, err
	}
	res := meter.result()
	res.durability = nakDurability(env.NATSSync)
	return res, nil
}

// nakLateness loads pending background messages naked with delays spread
// over an hour, then runs the probe: messages naked once with a 1 s delay;
// lateness is from the nak plus the delay to the redelivery.
func nakLateness(ctx context.Context, env Env, pending int, probe probeSpec) (latenessResult, error) {
	ns, pub, stopNATS, err := startNATSPeer(ctx, env.NATSSync, nakStreamConfig(), "bench-nak-producer")
	if err != nil {
		return latenessResult{}, err
	}
	defer stopNATS()

	bgFrom := backgroundStart(pending)
	var bgNaked atomic.Int64
	var nakAt sync.Map // stream sequence -> time.Time of the probe's nak
	rec := newProbeRecorder(probe)
	stop, err := consume(ctx, ns.js, nakStream, jetstream.ConsumerConfig{
		Durable: "nak-owner", MaxAckPending: -1, AckWait: 30 * time.Second,
	}, withMetadata(func(m jetstream.Msg, md *jetstream.MsgMetadata, now time.Time) {
		if m.Subject() == "nak.bg" {
			if md.NumDelivered == 1 {
				_ = m.NakWithDelay(time.Until(bgFrom.Add(time.Duration(rand.Int64N(int64(time.Hour))))))
				bgNaked.Add(1)
				return
			}
			_ = m.Ack()
			return
		}
		if md.NumDelivered == 1 {
			nakAt.Store(md.Sequence.Stream, now)
			_ = m.NakWithDelay(probe.delay)
			return
		}
		_ = m.Ack()
		if v, ok := nakAt.LoadAndDelete(md.Sequence.Stream); ok {
			rec.due(bytesUnixNano(m.Data()), v.(time.Time).Add(probe.delay), now)
		}
	}))
	if err != nil {
		return latenessResult{}, err
	}
	defer stop()

	loadStart := time.Now()
	for range pending {
		if err := pub.publish(ctx, nats.NewMsg("nak.bg"), nil); err != nil {
			return latenessResult{}, err
		}
	}
	if !waitFor(ctx, 10*time.Minute, func() bool { return bgNaked.Load() >= int64(pending) }) {
		return latenessResult{}, fmt.Errorf("background: %d of %d messages naked", bgNaked.Load(), pending)
	}
	loaded := time.Since(loadStart)

	err = rec.run(ctx, 2*probe.delay+10*time.Second, func(n int) error {
		for range n {
			msg := nats.NewMsg("nak.probe")
			msg.Data = unixNanoBytes(time.Now())
			if err := pub.publish(ctx, msg, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return latenessResult{}, err
	}
	res := rec.result()
	res.loadTime = loaded
	res.durability = nakDurability(env.NATSSync)
	res.loadHow = "publish + nak each with a delay to a random time in the hour"
	return res, nil
}

// nakBurst holds burst messages after their first delivery, then naks
// each with the delay that makes it due in the same second T..T+1s.
func nakBurst(ctx context.Context, env Env, n int) (burstResult, error) {
	ns, err := startNATSWith(ctx, env.NATSSync, nakStreamConfig())
	if err != nil {
		return burstResult{}, err
	}
	defer ns.close()
	pub := newAsyncPublisher(ns.js)
	var (
		mu      sync.Mutex
		held    []jetstream.Msg
		targets sync.Map // stream seq -> target time
	)
	br := newBurstRecorder(n)
	stop, err := consume(ctx, ns.js, nakStream, jetstream.ConsumerConfig{
		Durable: "nak-burst", MaxAckPending: -1, AckWait: 5 * time.Minute,
	}, withMetadata(func(m jetstream.Msg, md *jetstream.MsgMetadata, now time.Time) {
		if md.NumDelivered == 1 {
			mu.Lock()
			held = append(held, m)
			mu.Unlock()
			return
		}
		_ = m.Ack()
		if v, ok := targets.Load(md.Sequence.Stream); ok {
			br.received1(v.(time.Time), now)
		}
	}))
	if err != nil {
		pub.close()
		return burstResult{}, err
	}
	defer stop()
	for range n {
		if err := pub.publish(ctx, nats.NewMsg("nak.burst"), nil); err != nil {
			pub.close()
			return burstResult{}, err
		}
	}
	pub.close()
	heldCount := func() int { mu.Lock(); defer mu.Unlock(); return len(held) }
	if !waitFor(ctx, 5*time.Minute, func() bool { return heldCount() >= n }) {
		return burstResult{}, fmt.Errorf("burst: %d of %d messages delivered once", heldCount(), n)
	}
	t0 := time.Now().Add(2*time.Second + time.Duration(n)*20*time.Microsecond).Truncate(time.Second).Add(time.Second)
	br.setWindow(t0)
	mu.Lock()
	for i, m := range held {
		md, _ := m.Metadata()
		target := t0.Add(time.Duration(i) * time.Second / time.Duration(n))
		targets.Store(md.Sequence.Stream, target)
		_ = m.NakWithDelay(time.Until(target))
	}
	held = nil
	mu.Unlock()
	if late := time.Since(t0); late > 0 {
		return burstResult{}, fmt.Errorf("burst: naking took until %s after the burst second began", late)
	}
	br.wait(ctx, 2*time.Minute)
	res := br.result()
	res.durability = nakDurability(env.NATSSync)
	return res, nil
}
