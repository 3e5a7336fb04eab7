package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/retryd/retryd/internal/streams"
)

// sizes are the knobs of every scenario. --quick picks the small set (the
// CI smoke test, a few minutes in all); without it the full set runs (see
// docs/benchmarks.md for how long). Each flag overrides one knob in
// either mode.
type sizes struct {
	CycleWindow   int           // items in flight in the cycle workload
	CycleWarmup   time.Duration // per run, not counted
	CycleDuration time.Duration // measured per system, split over its two runs (A B B A)

	LatencyPending []int         // background pending counts of the lateness scenario
	Probe          probeSpec     // the probe stream
	Burst          int           // retries due in the same second
	RecoverPending int           // pending when the scheduler is killed
	RecoverSteady  time.Duration // probe time before the kill and after the restart
	RecoverDown    time.Duration // time the scheduler stays dead
	MemorySizes    []int         // pending counts of the memory/storage scenario
	MemoryFor      time.Duration // sampling time per size
	HistorySizes   []int         // retry_history sizes of the growth scenario
	GrowthPending  int           // background pending during growth
	GrowthFor      time.Duration // cycle and probe time per history size
	GrowthWarmup   time.Duration // unmeasured cycles before the first history size
	RetentionRows  int           // retention: history rows in each day partition it drops
	HoldEvents     int           // hold-release: events held, then released, per resume phase
	HoldBurst      int           // hold-release: events sent at once to the throttled source
}

func quickSizes() sizes {
	return sizes{
		CycleWindow: 1000, CycleWarmup: 2 * time.Second, CycleDuration: 10 * time.Second,
		LatencyPending: []int{10_000},
		Probe:          probeSpec{rate: 1000, dur: 8 * time.Second, delay: probeDelay, warmup: 2 * time.Second},
		Burst:          10_000,
		RecoverPending: 10_000, RecoverSteady: 5 * time.Second, RecoverDown: 2 * time.Second,
		MemorySizes: []int{1_000, 10_000}, MemoryFor: 5 * time.Second,
		HistorySizes: []int{0, 100_000}, GrowthPending: 10_000, GrowthFor: 5 * time.Second, GrowthWarmup: 5 * time.Second,
		RetentionRows: 100_000,
		HoldEvents:    2_000, HoldBurst: 1_000,
	}
}

func fullSizes() sizes {
	return sizes{
		CycleWindow: 5000, CycleWarmup: 5 * time.Second, CycleDuration: 60 * time.Second,
		LatencyPending: []int{10_000, 100_000, 1_000_000},
		Probe:          probeSpec{rate: 1000, dur: 30 * time.Second, delay: probeDelay, warmup: 3 * time.Second},
		Burst:          100_000,
		RecoverPending: 1_000_000, RecoverSteady: 15 * time.Second, RecoverDown: 5 * time.Second,
		MemorySizes: []int{10_000, 100_000, 1_000_000}, MemoryFor: 15 * time.Second,
		HistorySizes: []int{0, 1_000_000, 10_000_000}, GrowthPending: 100_000, GrowthFor: 20 * time.Second,
		GrowthWarmup:  streams.DuplicateWindow + 30*time.Second,
		RetentionRows: 1_000_000,
		HoldEvents:    100_000, HoldBurst: 10_000,
	}
}

// sizeFlags registers one flag per knob; apply overrides the preset with
// the flags that were set.
type sizeFlags struct {
	fs                                       *flag.FlagSet
	window, burst, recoverPending, probeRate *int
	holdEvents, holdBurst, retentionRows     *int
	cycleDur, probeDur, growthWarmup         *time.Duration
	pending, memory, history                 *string
}

func registerSizeFlags(fs *flag.FlagSet) *sizeFlags {
	return &sizeFlags{
		fs:             fs,
		window:         fs.Int("cycle-window", 0, "cycles: items in flight (quick 1000, full 5000)"),
		cycleDur:       fs.Duration("cycle-duration", 0, "cycles: measured time per system, over its two runs (quick 10s, full 60s)"),
		pending:        fs.String("pending", "", "lateness: background pending counts, comma separated (quick 10000, full 10000,100000,1000000)"),
		probeDur:       fs.Duration("probe-duration", 0, "lateness and memory: probe time per run (quick 8s, full 30s)"),
		probeRate:      fs.Int("probe-rate", 0, "probe items coming due per second (1000)"),
		burst:          fs.Int("burst", 0, "burst: retries due in the same second (quick 10000, full 100000)"),
		holdEvents:     fs.Int("hold-events", 0, "hold-release: events held then released, per resume phase (quick 2000, full 100000)"),
		holdBurst:      fs.Int("hold-burst", 0, "hold-release: events sent at once to the throttled source (quick 1000, full 10000)"),
		recoverPending: fs.Int("recovery-pending", 0, "recovery: pending retries when the scheduler is killed (quick 10000, full 1000000)"),
		memory:         fs.String("memory-sizes", "", "memory: pending counts, comma separated (quick 1000,10000, full 10000,100000,1000000)"),
		growthWarmup:   fs.Duration("growth-warmup", -1, "growth: unmeasured cycles before the first history size, so that every size runs with RETRIES' duplicate window full (quick 5s, full 2m30s; 0 skips it)"),
		history:        fs.String("history-sizes", "", "growth: retry_history sizes, comma separated (quick 0,100000, full 0,1000000,10000000)"),
		retentionRows:  fs.Int("retention-rows", 0, "retention: retry_history rows in each of the day partitions it drops, and in the retained days (quick 100000, full 1000000)"),
	}
}

func (f *sizeFlags) apply(s *sizes) error {
	if *f.window > 0 {
		s.CycleWindow = *f.window
	}
	if *f.cycleDur > 0 {
		s.CycleDuration = *f.cycleDur
	}
	if *f.growthWarmup >= 0 {
		s.GrowthWarmup = *f.growthWarmup
	}
	if *f.probeDur > 0 {
		s.Probe.dur = *f.probeDur
	}
	if *f.probeRate > 0 {
		s.Probe.rate = *f.probeRate
	}
	if *f.burst > 0 {
		s.Burst = *f.burst
	}
	if *f.recoverPending > 0 {
		s.RecoverPending = *f.recoverPending
	}
	if *f.holdEvents > 0 {
		s.HoldEvents = *f.holdEvents
	}
	if *f.holdBurst > 0 {
		s.HoldBurst = *f.holdBurst
	}
	if *f.retentionRows > 0 {
		s.RetentionRows = *f.retentionRows
	}
	lists := []struct {
		name string
		v    string
		dst  *[]int
	}{{"pending", *f.pending, &s.LatencyPending}, {"memory-sizes", *f.memory, &s.MemorySizes}, {"history-sizes", *f.history, &s.HistorySizes}}
	for _, l := range lists {
		if l.v == "" {
			continue
		}
		ns, err := parseInts(l.v)
		if err != nil {
			return fmt.Errorf("--%s: %w", l.name, err)
		}
		*l.dst = ns
	}
	return nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(p, "_", "")))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a non-negative number", p)
		}
		out = append(out, n)
	}
	return out, nil
}
