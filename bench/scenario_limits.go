package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func init() {
	register("limits", "what this machine's parts do alone: JetStream publish and consume, Postgres commits, batched inserts, updates and COPY (the ceilings behind cycles, burst and docs/capacity)", runLimits)
}

// limit is one measured ceiling: an operation of one component, alone on
// the machine, at the same durability as the other scenarios.
type limit struct {
	component, operation string
	rate                 float64 // per second
	unit                 string
	note                 string
}

// limitsFactSize is the size of a typical lifecycle fact on RETRIES
// (a failed fact with a short error and no payload, as the cycles
// scenario sends), so the rates compare with a cycle's messages.
const limitsFactSize = 420

func runLimits(ctx context.Context, env Env) error {
	n, dur := 200_000, 5*time.Second
	if env.Quick {
		n, dur = 20_000, time.Second
	}
	fmt.Fprintf(env.Out, "each part alone: %s JetStream messages of %d bytes (file storage, %s); each Postgres operation for %s\n",
		count(n), limitsFactSize, env.NATSSync, dur)
	js, err := jetStreamLimits(ctx, env, n, dur)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	pg, durab, err := postgresLimits(ctx, env, dur)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	t := newTable("component", "operation", "rate", "unit", "how")
	for _, l := range append(js, pg...) {
		t.row(l.component, l.operation, fmt.Sprintf("%.0f", l.rate), l.unit, l.note)
		env.rec.add("limits", l.component, l.operation, l.rate, l.unit, nil)
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	fmt.Fprintf(env.Out, "Postgres durability: %s\n", durab)
	return nil
}

const limitsStream = "LIMITS"

// jetStreamLimits measures publishing with acks (async window and one at
// a time) and consuming with explicit acks, on a fresh server.
func jetStreamLimits(ctx context.Context, env Env, n int, dur time.Duration) ([]limit, error) {
	ns, err := startNATSWith(ctx, env.NATSSync, jetstream.StreamConfig{
		Name: limitsStream, Subjects: []string{"limits.>"}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	defer ns.close()
	body := []byte(strings.Repeat("x", limitsFactSize))
	msg := func(i int) *nats.Msg {
		m := nats.NewMsg(fmt.Sprintf("limits.fact.%d", i%64))
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("limits:%d", i))
		m.Data = body
		return m
	}
	pub, closePub, err := ns.producer("limits-publisher")
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for i := range n {
		if err := pub.publish(ctx, msg(i), nil); err != nil {
			closePub()
			return nil, err
		}
	}
	if !pub.flush(ctx, 5*time.Minute) {
		closePub()
		return nil, fmt.Errorf("async publish: acks missing after 5m")
	}
	asyncRate := float64(n) / time.Since(start).Seconds()
	closePub()
	if errs, last := pub.errors(); errs > 0 {
		return nil, fmt.Errorf("async publish: %d failed, last: %w", errs, last)
	}

	syncN, start := 0, time.Now()
	for time.Since(start) < dur {
		if _, err := ns.js.PublishMsg(ctx, msg(n+syncN)); err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
		syncN++
	}
	syncRate := float64(syncN) / time.Since(start).Seconds()

	total := n + syncN
	var acked atomic.Int64
	start = time.Now()
	stop, err := consume(ctx, ns.js, limitsStream, jetstream.ConsumerConfig{Durable: "limits", MaxAckPending: -1},
		func(m jetstream.Msg) {
			if m.Ack() == nil {
				acked.Add(1)
			}
		})
	if err != nil {
		return nil, err
	}
	done := waitFor(ctx, 5*time.Minute, func() bool { return acked.Load() >= int64(total) })
	consumeRate := float64(acked.Load()) / time.Since(start).Seconds()
	stop()
	if !done {
		return nil, fmt.Errorf("consume: %d of %d acked after 5m", acked.Load(), total)
	}
	return []limit{
		{"JetStream", "publish, async acks", asyncRate, "msgs/s", "window of 8192 unacknowledged, Nats-Msg-Id on each"},
		{"JetStream", "publish, one at a time", syncRate, "msgs/s", "wait for each PubAck (one round trip)"},
		{"JetStream", "consume + ack", consumeRate, "msgs/s", "pull consumer, batches of 1000, explicit ack of each"},
	}, nil
}
