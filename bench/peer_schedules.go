package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream message schedules (nats-server 2.12+): a message published
// with "Nats-Schedule: @at <RFC 3339 time>" and "Nats-Schedule-Target:
// <subject>" on a stream with allow_msg_schedules is republished by the
// server to the target subject at that time. One schedule per subject: a
// later message on the same subject replaces it, so every pending retry
// needs its own schedule subject.
//
// nats.go's WithScheduleAt formats the time to the second; the server
// parses the header with time.RFC3339, which accepts fractions, so the
// bench sets the header itself with millisecond precision rather than
// charge the schedules up to a second of rounding.

const (
	schedStream       = "BENCH_SCHED"
	hdrSchedule       = "Nats-Schedule"
	hdrScheduleTarget = "Nats-Schedule-Target"
	hdrBenchAt        = "Bench-Due-At"
	hdrBenchPublished = "Bench-Published-At"
)

func schedStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              schedStream,
		Subjects:          []string{"sched.>", "fired.>"},
		Storage:           jetstream.FileStorage,
		AllowMsgSchedules: true,
		AllowRollup:       true,
	}
}

func scheduleMsg(subject, target string, at, published time.Time) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Header.Set(hdrSchedule, "@at "+at.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	msg.Header.Set(hdrScheduleTarget, target)
	msg.Header.Set(hdrBenchAt, strconv.FormatInt(at.UnixNano(), 10))
	msg.Header.Set(hdrBenchPublished, strconv.FormatInt(published.UnixNano(), 10))
	return msg
}

func headerTime(m jetstream.Msg, name string) time.Time {
	v, err := strconv.ParseInt(m.Headers().Get(name), 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(0, v)
}

// schedulesLateness loads pending schedules spread over an hour (each on
// its own subject), then schedules the probe items 1 s ahead.
func schedulesLateness(ctx context.Context, env Env, pending int, probe probeSpec) (latenessResult, error) {
	ns, pub, stopNATS, err := startNATSPeer(ctx, env.NATSSync, schedStreamConfig(), "bench-sched-producer")
	if err != nil {
		return latenessResult{}, err
	}
	defer stopNATS()

	rec := newProbeRecorder(probe)
	stop, err := consume(ctx, ns.js, schedStream, jetstream.ConsumerConfig{
		Durable: "sched-owner", FilterSubject: "fired.probe", MaxAckPending: 100_000,
	}, func(m jetstream.Msg) {
		now := time.Now()
		_ = m.Ack()
		rec.due(headerTime(m, hdrBenchPublished), headerTime(m, hdrBenchAt), now)
	})
	if err != nil {
		return latenessResult{}, err
	}
	defer stop()

	loadStart := time.Now()
	bg := pendingRows{n: pending, from: backgroundStart(pending), span: time.Hour}
	for i := range pending {
		at := bg.dueAt(i)
		if err := pub.publish(ctx, scheduleMsg("sched.bg."+strconv.Itoa(i), "fired.bg", at, loadStart), nil); err != nil {
			return latenessResult{}, err
		}
	}
	// Wait for the acks: the load is done when the server stored it.
	if !pub.flush(ctx, 10*time.Minute) {
		return latenessResult{}, fmt.Errorf("background schedules not acknowledged")
	}
	if n, err := pub.errors(); n > 0 {
		return latenessResult{}, fmt.Errorf("load schedules: %d publishes failed, last: %w", n, err)
	}
	loaded := time.Since(loadStart)

	seq := 0
	err = rec.run(ctx, 2*probe.delay+10*time.Second, func(n int) error {
		for range n {
			now := time.Now()
			seq++
			if err := pub.publish(ctx, scheduleMsg("sched.probe."+strconv.Itoa(seq), "fired.probe", now.Add(probe.delay), now), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return latenessResult{}, err
	}
	if n, err := pub.errors(); n > 0 {
		return latenessResult{}, fmt.Errorf("probe schedules: %d publishes failed, last: %w", n, err)
	}
	res := rec.result()
	res.loadTime = loaded
	res.durability = nakDurability(env.NATSSync)
	res.loadHow = "publish one @at schedule per subject"
	return res, nil
}

// schedulesBurst schedules n messages for the same second.
func schedulesBurst(ctx context.Context, env Env, n int) (burstResult, error) {
	ns, err := startNATSWith(ctx, env.NATSSync, schedStreamConfig())
	if err != nil {
		return burstResult{}, err
	}
	defer ns.close()
	br := newBurstRecorder(n)
	stop, err := consume(ctx, ns.js, schedStream, jetstream.ConsumerConfig{
		Durable: "sched-burst", FilterSubject: "fired.burst", MaxAckPending: -1,
	}, func(m jetstream.Msg) {
		now := time.Now()
		if md, err := m.Metadata(); err == nil {
			br.stored1(md.Timestamp)
		}
		_ = m.Ack()
		br.received1(headerTime(m, hdrBenchAt), now)
	})
	if err != nil {
		return burstResult{}, err
	}
	defer stop()
	t0, loadStart := br.startLoad(20_000)
	pub := newAsyncPublisher(ns.js)
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Second / time.Duration(n))
		if err := pub.publish(ctx, scheduleMsg("sched.burst."+strconv.Itoa(i), "fired.burst", at, loadStart), nil); err != nil {
			pub.close()
			return burstResult{}, err
		}
	}
	pub.close()
	if n, err := pub.errors(); n > 0 {
		return burstResult{}, fmt.Errorf("burst schedules: %d publishes failed, last: %w", n, err)
	}
	res, err := br.loaded(ctx)
	if err != nil {
		return burstResult{}, err
	}
	res.durability = nakDurability(env.NATSSync)
	return res, nil
}

// burstSecond is the start of the second the burst comes due in: far
// enough ahead to load n items at perSecond, on a whole second.
func burstSecond(n, perSecond int) time.Time {
	lead := 3*time.Second + time.Duration(float64(n)/float64(perSecond)*float64(time.Second))
	return time.Now().Add(lead).Truncate(time.Second).Add(time.Second)
}
