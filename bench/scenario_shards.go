package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

func init() {
	register("shards", "retry cycles/s and due lateness with RETRIES split into 1, 2 and 4 scheduler shards (a database each), and 2 instances on 1 shard", runShards)
}

// shardLayouts: the scaling asked of shards (1, 2, 4), and the other way
// to add schedulers, more instances on one database.
var shardLayouts = []shardLayout{{shards: 1, instances: 1}, {shards: 2, instances: 1}, {shards: 4, instances: 1}, {shards: 1, instances: 2}}

// shardCycleRun is one cycles run of a layout and the machine's CPU in
// its measured window.
type shardCycleRun struct {
	res   cycleResult
	cores float64
}

func runShards(ctx context.Context, env Env) error {
	s := env.Sizes
	if !env.runs("retryd") {
		fmt.Fprintln(env.Out, "retryd is not among --systems: nothing to run")
		return nil
	}
	layouts := shardLayouts
	// Each layout is measured twice, A B C D D C B A, so a drift of the
	// machine over the run lands on every layout alike; --quick once.
	order := append(append([]shardLayout(nil), layouts...), reversed(layouts)...)
	per := s.CycleDuration / 2
	if env.Quick {
		order, per = layouts, s.CycleDuration
	}
	pending := shardPending(s.LatencyPending)
	names := make([]string, len(order))
	for i, l := range order {
		names[i] = l.String()
	}
	fmt.Fprintf(env.Out, "cycles: %d items in flight, %s measured per run once %s passed and the first %d completed; order %s\n",
		s.CycleWindow, per, s.CycleWarmup, s.CycleWindow, strings.Join(names, " | "))
	fmt.Fprintf(env.Out, "lateness: %s pending over the next hour, split by shard, + probe %d/s due %s later for %s\n",
		count(pending), s.Probe.rate, s.Probe.delay, s.Probe.dur)
	fmt.Fprintln(env.Out, "every shard's database is on the run's one Postgres server; NATS, schedulers and owner share this process")

	runs := map[shardLayout][]shardCycleRun{}
	for i, l := range order {
		run, err := shardCycles(ctx, env, l, s.CycleWindow, s.CycleWarmup, per)
		if err != nil {
			return fmt.Errorf("%s cycles (run %d): %w", l, i+1, err)
		}
		fmt.Fprintf(env.Out, "  run %d %-20s %8.0f cycles/s  p50 %s  p99 %s  CPU %.2f cores busy  (warm-up %s)\n", i+1, l, run.res.rate,
			ms(run.res.latency.P50), ms(run.res.latency.P99), run.cores, run.res.warmup.Round(100*time.Millisecond))
		runs[l] = append(runs[l], run)
	}
	late := map[shardLayout]latenessResult{}
	for _, l := range layouts {
		r, err := shardLateness(ctx, env, l, pending, s.Probe)
		if err != nil {
			return fmt.Errorf("%s lateness: %w", l, err)
		}
		fmt.Fprintf(env.Out, "  lateness %-20s p50 %s  p99 %s  max %s  received %d/%d\n", l, ms(r.lat.P50), ms(r.lat.P99), ms(r.lat.Max), r.received, r.expected)
		late[l] = r
	}

	rate := func(l shardLayout) float64 {
		n, d := 0, time.Duration(0)
		for _, r := range runs[l] {
			n += r.res.completed
			d += r.res.dur
		}
		if d == 0 {
			return 0
		}
		return float64(n) / d.Seconds()
	}
	base := rate(shardLayout{shards: 1, instances: 1})
	t := newTable("layout", "schedulers", "cycles/s", "runs", "vs 1 shard", "p99 cycle", "CPU busy", "CPU/cycle", "late p50", "late p99", "late max", "e2e p99", "received")
	for _, l := range layouts {
		var rs string
		var cores float64
		var lat []cycleResult
		for i, r := range runs[l] {
			if i > 0 {
				rs += " / "
			}
			rs += fmt.Sprintf("%.0f", r.res.rate)
			cores += r.cores / float64(len(runs[l]))
			lat = append(lat, r.res)
		}
		lr := late[l]
		t.row(l.String(), fmt.Sprint(l.shards*l.instances), fmt.Sprintf("%.0f", rate(l)), rs, ratioHigher(rate(l), base),
			ms(worst(lat).P99), fmt.Sprintf("%.2f cores", cores), cpuPerCycle(cores, rate(l)),
			ms(lr.lat.P50), ms(lr.lat.P99), ms(lr.lat.Max), ms(lr.e2e.P99), fmt.Sprintf("%d/%d", lr.received, lr.expected))
		params := map[string]any{"shards": l.shards, "instances": l.instances, "window": s.CycleWindow, "pending": pending}
		env.rec.add("shards", l.String(), "cycles_per_s", rate(l), "1/s", params)
		env.rec.add("shards", l.String(), "cpu_busy_cores", cores, "cores", params)
		env.rec.addDuration("shards", l.String(), "lateness_p99", lr.lat.P99, params)
		env.rec.addDuration("shards", l.String(), "lateness_max", lr.lat.Max, params)
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	fmt.Fprintf(env.Out, "CPU busy = the whole machine's busy cores in each measured window (of %s), averaged over the runs; CPU/cycle = CPU busy / cycles/s (everything on the machine, other sessions included)\n", cpuCount())
	if len(layouts) > 0 {
		if r, ok := late[layouts[0]]; ok {
			fmt.Fprintln(env.Out, "durability:", r.durability)
		}
	}
	return nil
}

// shardPending is the background of the lateness runs: the largest
// --pending size up to 100,000 (each layout loads it again), or the
// smallest.
func shardPending(sizes []int) int {
	best := 0
	for _, n := range sizes {
		if n <= 100_000 && n > best {
			best = n
		}
	}
	if best == 0 && len(sizes) > 0 {
		best = sizes[0]
		for _, n := range sizes {
			best = min(best, n)
		}
	}
	return best
}

func cpuPerCycle(cores, rate float64) string {
	if rate <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f ms", cores/rate*1000)
}

func cpuCount() string {
	c, err := readCPUTimes()
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%d", c.cpus)
}

func shardCycles(ctx context.Context, env Env, l shardLayout, window int, warmup, dur time.Duration) (shardCycleRun, error) {
	s, err := startSharded(ctx, env, l)
	if err != nil {
		return shardCycleRun{}, err
	}
	defer s.close(ctx)
	var mu sync.Mutex
	var from cpuTimes
	var fromErr error
	s.onMeter = func(m *cycleMeter) {
		m.onOpen = func() {
			c, err := readCPUTimes()
			mu.Lock()
			from, fromErr = c, err
			mu.Unlock()
		}
	}
	res, err := s.cycles(ctx, window, warmup, dur)
	if err != nil {
		return shardCycleRun{}, err
	}
	to, err := readCPUTimes()
	mu.Lock()
	defer mu.Unlock()
	if err == nil {
		err = fromErr
	}
	if err == nil && from.total == 0 {
		err = fmt.Errorf("the measured window never opened")
	}
	if err != nil {
		return shardCycleRun{}, err
	}
	res.durability = s.durability(ctx)
	return shardCycleRun{res: res, cores: coresBusy(from, to)}, nil
}

func shardLateness(ctx context.Context, env Env, l shardLayout, pending int, spec probeSpec) (latenessResult, error) {
	s, err := startSharded(ctx, env, l)
	if err != nil {
		return latenessResult{}, err
	}
	defer s.close(ctx)
	stopBG, err := s.background(ctx, pending)
	if err != nil {
		return latenessResult{}, err
	}
	defer stopBG()
	return s.probe(ctx, spec)
}
