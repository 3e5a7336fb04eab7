package main

import (
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
	durability string
	note       string
}

// cycleMeter counts completions inside a measurement window that starts
// after a warm-up (connection pools, JIT-free but cache-cold Postgres,
// consumers being created) and lasts dur.
type cycleMeter struct {
	warmup, dur time.Duration
	t0          time.Time
	from, to    time.Time
	completed   atomic.Int64
	lat         latencies
	end         chan struct{}
	endOnce     sync.Once
	over        atomic.Bool
}

func newCycleMeter(warmup, dur time.Duration) *cycleMeter {
	return &cycleMeter{warmup: warmup, dur: dur, end: make(chan struct{})}
}

func (m *cycleMeter) start() {
	m.t0 = time.Now()
	m.from = m.t0.Add(m.warmup)
	m.to = m.from.Add(m.dur)
	time.AfterFunc(m.warmup+m.dur, func() {
		m.over.Store(true)
		m.endOnce.Do(func() { close(m.end) })
	})
}

// done records a completed cycle of an item started at startedAt.
func (m *cycleMeter) done(startedAt time.Time) {
	now := time.Now()
	if now.Before(m.from) || now.After(m.to) {
		return
	}
	m.completed.Add(1)
	if !startedAt.IsZero() {
		m.lat.add(now.Sub(startedAt))
	}
}

func (m *cycleMeter) finished() bool { return m.over.Load() }

func (m *cycleMeter) wait() <-chan struct{} { return m.end }

func (m *cycleMeter) result() cycleResult {
	n := int(m.completed.Load())
	return cycleResult{completed: n, dur: m.dur, rate: float64(n) / m.dur.Seconds(), latency: m.lat.summary()}
}
