package main

import (
	"context"
	"fmt"
	"time"
)

func init() {
	register("lateness", "due lateness p50/p99/max with P pending over an hour + 1,000/s probe (retryd, NakWithDelay, message schedules)", runLateness)
}

type latenessSystem struct {
	name string
	run  func(ctx context.Context, env Env, pending int, spec probeSpec) (latenessResult, error)
}

var latenessSystems = []latenessSystem{
	{"retryd", retrydLateness},
	{"NakWithDelay", nakLateness},
	{"schedules", schedulesLateness},
}

// Targets: p99 under 100 ms and at least 10x better than NakWithDelay.
const (
	latenessTarget      = 100 * time.Millisecond
	latenessRatioTarget = 10.0
)

func runLateness(ctx context.Context, env Env) error {
	s := env.Sizes
	fmt.Fprintf(env.Out, "probe: %d/s failing once, due %s later, for %s (first %s not counted); background spread over the next hour\n",
		s.Probe.rate, s.Probe.delay, s.Probe.dur, s.Probe.warmup)
	fmt.Fprintln(env.Out, "lateness = owner received the retry - the time it was due; e2e = received - failure reported - delay")
	systems := pick(env, latenessSystems, func(s latenessSystem) string { return s.name })
	order := systems
	for _, pending := range s.LatencyPending {
		res := map[string]latenessResult{}
		for _, sys := range order {
			r, err := sys.run(ctx, env, pending, s.Probe)
			if err != nil {
				return fmt.Errorf("%s with %d pending: %w", sys.name, pending, err)
			}
			r.pending = pending
			res[sys.name] = r
			params := map[string]any{"pending": pending, "probe_rate": s.Probe.rate}
			env.rec.addDuration("lateness", sys.name, "p50", r.lat.P50, params)
			env.rec.addDuration("lateness", sys.name, "p99", r.lat.P99, params)
			env.rec.addDuration("lateness", sys.name, "max", r.lat.Max, params)
			env.rec.add("lateness", sys.name, "lost", float64(r.expected-r.received), "items", params)
		}
		// Alternate the order from one size to the next (A B C, C B A, ...).
		order = reversed(order)
		fmt.Fprintf(env.Out, "\npending %s:\n", count(pending))
		t := newTable("system", "p50", "p99", "max", "e2e p50", "e2e p99", "received", "load")
		for _, sys := range systems {
			r := res[sys.name]
			t.row(sys.name, ms(r.lat.P50), ms(r.lat.P99), ms(r.lat.Max), ms(r.e2e.P50), ms(r.e2e.P99),
				fmt.Sprintf("%d/%d", r.received, r.expected), r.loadTime.Round(100*time.Millisecond).String())
		}
		t.print(env.Out)
		for _, sys := range systems {
			r := res[sys.name]
			fmt.Fprintf(env.Out, "  %-13s load: %s; %s\n", sys.name, r.loadHow, r.durability)
		}
		rd, ok := res["retryd"]
		if !ok {
			continue
		}
		fmt.Fprintf(env.Out, "p99 lateness %s (target < %s): %s", ms(rd.lat.P99), ms(latenessTarget), verdict(rd.lat.P99 < latenessTarget && rd.lat.N > 0))
		if nak, ok := res["NakWithDelay"]; ok {
			ratio := float64(nak.lat.P99) / float64(max(rd.lat.P99, time.Microsecond))
			fmt.Fprintf(env.Out, " — NakWithDelay p99 %s, ratio %s (target >= %.0fx): %s", ms(nak.lat.P99), ratioLower(rd.lat.P99, nak.lat.P99),
				latenessRatioTarget, verdict(ratio >= latenessRatioTarget))
		}
		if sch, ok := res["schedules"]; ok {
			fmt.Fprintf(env.Out, "; schedules p99 %s, ratio %s", ms(sch.lat.P99), ratioLower(rd.lat.P99, sch.lat.P99))
		}
		fmt.Fprintln(env.Out)
		if rd.received < rd.expected {
			fmt.Fprintf(env.Out, "retryd: %d probe items had not come back when arrivals stopped (see e2e: the failed path fell behind)\n", rd.expected-rd.received)
		}
	}
	return nil
}
