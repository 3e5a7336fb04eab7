package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// probeSpec is the probe stream of the lateness scenarios: rate items a
// second, each failing once and due delay later, for dur. Items published
// during the first warmup are not counted (pools, consumers and caches
// warming up).
type probeSpec struct {
	rate   int
	dur    time.Duration
	delay  time.Duration
	warmup time.Duration
}

// latenessResult is one system's lateness run.
type latenessResult struct {
	pending int
	// lat is from the time the item was due (next_attempt_at, or the nak
	// time plus the delay, or the schedule time) to the owner receiving it.
	lat summary
	// e2e is the extra time on top of the delay from the owner reporting
	// the failure to receiving the retry: lateness plus the time the
	// failure took to be scheduled.
	e2e        summary
	expected   int
	received   int
	loadTime   time.Duration
	loadHow    string
	durability string
}

type probeRecorder struct {
	spec     probeSpec
	start    atomic.Int64 // unix nanoseconds; read by consumer goroutines
	lat, e2e latencies
	received atomic.Int64
	expected atomic.Int64
	// observe, when set, also gets each counted item (the retention
	// scenario splits them by when they were reported or came due).
	observe func(dueSample)
}

func newProbeRecorder(spec probeSpec) *probeRecorder { return &probeRecorder{spec: spec} }

// due records a probe item published (failure reported) at publishedAt,
// meant to come due at dueAt, received at receivedAt.
func (r *probeRecorder) due(publishedAt, dueAt, receivedAt time.Time) {
	r.received.Add(1)
	if publishedAt.Before(time.Unix(0, r.start.Load()).Add(r.spec.warmup)) {
		return
	}
	late, e2e := receivedAt.Sub(dueAt), receivedAt.Sub(publishedAt)-r.spec.delay
	r.lat.add(late)
	r.e2e.add(e2e)
	if r.observe != nil {
		r.observe(dueSample{published: publishedAt, due: dueAt, late: late, e2e: e2e})
	}
}

// run publishes the probe stream with publish(n) at spec.rate for
// spec.dur, then waits up to drainFor for every item to come back.
func (r *probeRecorder) run(ctx context.Context, drainFor time.Duration, publish func(n int) error) error {
	r.start.Store(time.Now().UnixNano())
	sent, err := pace(ctx, r.spec.rate, r.spec.dur, publish)
	r.expected.Store(int64(sent))
	if err != nil {
		return err
	}
	r.drain(ctx, drainFor)
	return nil
}

// drain waits until every probe item came back, for at least timeout and
// then for as long as items keep arriving (a system that fell behind is
// measured when it catches up, not cut off), at most maxDrain.
func (r *probeRecorder) drain(ctx context.Context, timeout time.Duration) {
	const stall, maxDrain = 15 * time.Second, 5 * time.Minute
	start := time.Now()
	last, lastAt := r.received.Load(), time.Now()
	waitFor(ctx, maxDrain, func() bool {
		n := r.received.Load()
		if n >= r.expected.Load() {
			return true
		}
		if n > last {
			last, lastAt = n, time.Now()
		}
		return time.Since(start) > timeout && time.Since(lastAt) > stall
	})
}

func (r *probeRecorder) result() latenessResult {
	return latenessResult{
		lat: r.lat.summary(), e2e: r.e2e.summary(),
		expected: int(r.expected.Load()), received: int(r.received.Load()),
	}
}

// burstResult is one system's burst run: n items due within one second
// starting at t0.
type burstResult struct {
	n, received int
	// drain is from the start of the burst second to the last item
	// received; after is from the end of that second.
	drain, after time.Duration
	// published is from the start of the burst second to when the stream
	// stored the last due message (its JetStream timestamp): the time to
	// publish the burst, before the owner's consumer had to read it. Zero
	// for systems without such a message (River).
	published  time.Duration
	lat        summary // each item from its due time to its receipt
	loadTime   time.Duration
	durability string
	cost       *burstCost // retryd's only
}

type burstRecorder struct {
	n         int
	t0        time.Time
	loadStart time.Time
	mu        sync.Mutex
	last      time.Time
	stored    time.Time
	received  atomic.Int64
	lat       latencies
}

func newBurstRecorder(n int) *burstRecorder { return &burstRecorder{n: n} }

func (b *burstRecorder) setWindow(t0 time.Time) { b.t0 = t0 }

// startLoad starts the clock of a load of the burst at perSecond items a
// second and sets the burst second far enough ahead of it (burstSecond);
// loaded stops the clock.
func (b *burstRecorder) startLoad(perSecond int) (t0, loadStart time.Time) {
	b.loadStart = time.Now()
	b.setWindow(burstSecond(b.n, perSecond))
	return b.t0, b.loadStart
}

func (b *burstRecorder) received1(dueAt, at time.Time) {
	b.received.Add(1)
	b.lat.add(at.Sub(dueAt))
	b.mu.Lock()
	if at.After(b.last) {
		b.last = at
	}
	b.mu.Unlock()
}

// stored1 records when the stream stored a due message.
func (b *burstRecorder) stored1(at time.Time) {
	b.mu.Lock()
	if at.After(b.stored) {
		b.stored = at
	}
	b.mu.Unlock()
}

func (b *burstRecorder) wait(ctx context.Context, timeout time.Duration) {
	waitFor(ctx, time.Until(b.t0)+timeout, func() bool { return b.received.Load() >= int64(b.n) })
}

// loaded waits out a burst whose load (from startLoad) ended now, and
// returns its result with the load time. A load that ran into the burst
// second is an error: the burst would measure the loader.
func (b *burstRecorder) loaded(ctx context.Context) (burstResult, error) {
	loadTime := time.Since(b.loadStart)
	if late := time.Since(b.t0); late > 0 {
		return burstResult{}, fmt.Errorf("burst: loading took until %s after the burst second began", late)
	}
	b.wait(ctx, 2*time.Minute)
	res := b.result()
	res.loadTime = loadTime
	return res, nil
}

func (b *burstRecorder) result() burstResult {
	b.mu.Lock()
	last, stored := b.last, b.stored
	b.mu.Unlock()
	r := burstResult{n: b.n, received: int(b.received.Load()), lat: b.lat.summary()}
	if !stored.IsZero() {
		r.published = stored.Sub(b.t0)
	}
	if !last.IsZero() {
		r.drain = last.Sub(b.t0)
		r.after = last.Sub(b.t0.Add(time.Second))
	}
	return r
}
