package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// cycleResult is one system's run of the cycle workload.
type cycleResult struct {
	completed  int
	dur        time.Duration
	rate       float64 // completed cycles per second
	latency    summary // item start to completion
	warmup     time.Duration
	durability string
	// cost is what the window cost (nil for a system the bench does not
	// measure it for); costNotes say what could not be read.
	cost      *costRun
	costNotes []string
}

// maxWarmup bounds the wait for the first window to cycle through.
const maxWarmup = 2 * time.Minute

// cycleMeter counts completions inside a measurement window. The window
// opens once the warm-up has passed and every item of the initial window
// has completed once (so a slow system is measured in its steady state,
// not while its first wave is still queued), and lasts dur.
type cycleMeter struct {
	window      int
	warmup, dur time.Duration

	mu        sync.Mutex
	t0        time.Time
	from, to  time.Time // zero until the window opens
	total     int       // completions since start
	completed atomic.Int64
	lat       latencies
	end       chan struct{}
	over      atomic.Bool
	// onOpen, if set, runs in a goroutine of its own as the window opens
	// (the cost probe's first reading).
	onOpen func()
}

func newCycleMeter(window int, warmup, dur time.Duration) *cycleMeter {
	return &cycleMeter{window: window, warmup: warmup, dur: dur, end: make(chan struct{})}
}

func (m *cycleMeter) start() {
	m.mu.Lock()
	m.t0 = time.Now()
	m.mu.Unlock()
	// The warm-up may end after the first wave did: open the window then.
	time.AfterFunc(m.warmup, func() { m.maybeOpen(time.Now()) })
	time.AfterFunc(maxWarmup, func() { m.open(time.Now()) })
}

func (m *cycleMeter) maybeOpen(now time.Time) {
	m.mu.Lock()
	ready := m.from.IsZero() && m.total >= m.window && now.Sub(m.t0) >= m.warmup
	m.mu.Unlock()
	if ready {
		m.open(now)
	}
}

func (m *cycleMeter) open(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.from.IsZero() {
		return
	}
	m.from, m.to = now, now.Add(m.dur)
	if m.onOpen != nil {
		go m.onOpen()
	}
	time.AfterFunc(m.dur, func() {
		m.over.Store(true)
		close(m.end)
	})
}

// done records a completed cycle of an item started at startedAt.
func (m *cycleMeter) done(startedAt time.Time) {
	now := time.Now()
	m.mu.Lock()
	m.total++
	from, to := m.from, m.to
	waiting := from.IsZero() && m.total >= m.window && now.Sub(m.t0) >= m.warmup
	m.mu.Unlock()
	if waiting {
		m.open(now)
		return
	}
	if from.IsZero() || now.Before(from) || now.After(to) {
		return
	}
	m.completed.Add(1)
	if !startedAt.IsZero() {
		m.lat.add(now.Sub(startedAt))
	}
}

// drive keeps window items in flight until the measurement is over: it
// starts window items, then a new one for each signal on replenish (a
// completed cycle). It returns the first error of newItem or of errc,
// where the system's callbacks report theirs (with reportFirst).
func (m *cycleMeter) drive(ctx context.Context, window int, replenish <-chan struct{}, errc chan error, newItem func() error) error {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-replenish:
				if m.finished() {
					continue
				}
				if err := newItem(); err != nil {
					reportFirst(ctx, errc, err)
					return
				}
			}
		}
	}()
	m.start()
	for range window {
		if err := newItem(); err != nil {
			return err
		}
	}
	return m.await(ctx, errc)
}

// await waits for the end of the measurement, the system's first error
// on errc, or the end of ctx.
func (m *cycleMeter) await(ctx context.Context, errc <-chan error) error {
	select {
	case <-m.wait():
		return nil
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// reportFirst hands err to errc unless the run is already over (an error
// then is the run's end, not a failure) or an earlier error waits there.
func reportFirst(ctx context.Context, errc chan<- error, err error) {
	if ctx.Err() != nil {
		return
	}
	select {
	case errc <- err:
	default:
	}
}

func (m *cycleMeter) finished() bool { return m.over.Load() }

func (m *cycleMeter) wait() <-chan struct{} { return m.end }

func (m *cycleMeter) result() cycleResult {
	n := int(m.completed.Load())
	m.mu.Lock()
	warm := m.from.Sub(m.t0)
	m.mu.Unlock()
	return cycleResult{completed: n, dur: m.dur, rate: float64(n) / m.dur.Seconds(), latency: m.lat.summary(), warmup: warm}
}
