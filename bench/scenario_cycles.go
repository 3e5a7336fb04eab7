package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

func init() {
	register("cycles", "retry cycles/s: fail once, retry after 100 ms, succeed (retryd in process, retryd-scheduler as a process, River, NakWithDelay; A B C D D C B A)", runCycles)
}

type cycleSystem struct {
	name string
	run  func(ctx context.Context, env Env, window int, warmup, dur time.Duration) (cycleResult, error)
}

var cycleSystems = []cycleSystem{
	{"retryd", retrydCycles},
	{"retryd-process", retrydProcessCycles},
	{"River", riverCycles},
	{"NakWithDelay", nakCycles},
}

// cycleTarget: retryd completes at least twice River's cycles per second.
const cycleTarget = 2.0

func runCycles(ctx context.Context, env Env) error {
	s := env.Sizes
	per := s.CycleDuration / 2
	systems := pick(env, cycleSystems, func(s cycleSystem) string { return s.name })
	order := append(append([]cycleSystem(nil), systems...), reversed(systems)...)
	fmt.Fprintf(env.Out, "%d items in flight; each run measures %s once %s passed and the first %d items completed; order %s\n",
		s.CycleWindow, per, s.CycleWarmup, s.CycleWindow, runOrder(len(systems)))
	type agg struct {
		runs       []cycleResult
		durability string
	}
	results := map[string]*agg{}
	costs := map[string]*costTotal{}
	for i, sys := range order {
		runEnv := env
		runEnv.cycleRun = i + 1
		var res cycleResult
		var err error
		// Everything the run starts without a label of its own is the
		// owner's (see cost_profile.go).
		labelled(ctx, compOwner, func(ctx context.Context) {
			res, err = sys.run(ctx, runEnv, s.CycleWindow, s.CycleWarmup, per)
		})
		if err != nil {
			return fmt.Errorf("%s (run %d): %w", sys.name, i+1, err)
		}
		fmt.Fprintf(env.Out, "  run %d %-13s %8.0f cycles/s  p50 %s  p99 %s  (warm-up %s)\n", i+1, sys.name, res.rate,
			ms(res.latency.P50), ms(res.latency.P99), res.warmup.Round(100*time.Millisecond))
		a := results[sys.name]
		if a == nil {
			a = &agg{}
			results[sys.name] = a
		}
		a.runs = append(a.runs, res)
		a.durability = res.durability
		if res.cost != nil {
			if costs[sys.name] == nil {
				costs[sys.name] = &costTotal{}
			}
			costs[sys.name].add(*res.cost)
		}
		for _, n := range res.costNotes {
			fmt.Fprintf(env.Out, "    cost: %s\n", n)
		}
	}
	rate := func(name string) float64 {
		a := results[name]
		if a == nil {
			return 0
		}
		n, d := 0, time.Duration(0)
		for _, r := range a.runs {
			n += r.completed
			d += r.dur
		}
		return float64(n) / d.Seconds()
	}
	river := rate("River")
	t := newTable("system", "cycles/s", "run 1", "run 2", "p50 cycle", "p99 cycle", "vs River", "vs NakWithDelay")
	for _, sys := range systems {
		a := results[sys.name]
		r := rate(sys.name)
		lat := worst(a.runs)
		t.row(sys.name, fmt.Sprintf("%.0f", r), fmt.Sprintf("%.0f", a.runs[0].rate), fmt.Sprintf("%.0f", a.runs[1].rate),
			ms(lat.P50), ms(lat.P99), ratioHigher(r, river), ratioHigher(r, rate("NakWithDelay")))
		env.rec.add("cycles", sys.name, "cycles_per_s", r, "1/s", map[string]any{"window": s.CycleWindow, "seconds": s.CycleDuration.Seconds()})
		env.rec.addDuration("cycles", sys.name, "cycle_p99", lat.P99, nil)
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	if rd := rate("retryd"); rd > 0 && river > 0 {
		fmt.Fprintf(env.Out, "\nretryd %.0f cycles/s (target >= %.0fx River) — River %.0f/s, ratio %s: %s\n",
			rd, cycleTarget, river, ratioHigher(rd, river), verdict(rd >= cycleTarget*river))
	}
	fmt.Fprintln(env.Out, "durability:")
	for _, sys := range systems {
		fmt.Fprintf(env.Out, "  %-15s %s\n", sys.name, results[sys.name].durability)
	}
	fmt.Fprintln(env.Out, "cycle = retryd: failed published -> succeeded PubAck; River: job inserted -> job_completed event; NakWithDelay: published -> acked")
	printCycleCost(env, costs)
	return nil
}

// pick keeps the systems --systems asks for, in order.
func pick[T any](env Env, all []T, name func(T) string) []T {
	var out []T
	for _, s := range all {
		if env.runs(name(s)) {
			out = append(out, s)
		}
	}
	return out
}

// runOrder names the order of n systems' runs: A B C C B A for three.
func runOrder(n int) string {
	letters := make([]string, 0, 2*n)
	for i := range n {
		letters = append(letters, string(rune('A'+i)))
	}
	for i := n - 1; i >= 0; i-- {
		letters = append(letters, string(rune('A'+i)))
	}
	return strings.Join(letters, " ")
}

func reversed[T any](s []T) []T {
	out := make([]T, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// worst keeps the higher p50 and p99 of several runs (latencies are not
// merged, the runs are reported as the worse one).
func worst(runs []cycleResult) summary {
	var w summary
	for _, r := range runs {
		w.P50 = max(w.P50, r.latency.P50)
		w.P99 = max(w.P99, r.latency.P99)
		w.Max = max(w.Max, r.latency.Max)
	}
	return w
}
