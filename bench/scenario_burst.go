package main

import (
	"context"
	"fmt"
	"time"
)

func init() {
	register("burst", "N retries due in the same second: time until the owner has every due event (retryd in process, retryd-scheduler as a process, River, NakWithDelay, schedules)", runBurst)
}

type burstSystem struct {
	name string
	run  func(ctx context.Context, env Env, n int) (burstResult, error)
}

var burstSystems = []burstSystem{
	{"retryd", retrydBurst},
	{"retryd-process", retrydProcessBurst},
	{"River", riverBurst},
	{"NakWithDelay", nakBurst},
	{"schedules", schedulesBurst},
}

const burstTarget = 3 * time.Second

func runBurst(ctx context.Context, env Env) error {
	n := env.Sizes.Burst
	fmt.Fprintf(env.Out, "%s items due evenly within one second T..T+1s, loaded ahead of T; published = last due message stored in its stream - T; drain = last received by the owner - T\n", count(n))
	res := map[string]burstResult{}
	systems := pick(env, burstSystems, func(s burstSystem) string { return s.name })
	for _, sys := range systems {
		r, err := sys.run(ctx, env, n)
		if err != nil {
			return fmt.Errorf("%s: %w", sys.name, err)
		}
		res[sys.name] = r
		params := map[string]any{"n": n}
		env.rec.addDuration("burst", sys.name, "drain", r.drain, params)
		if r.published > 0 {
			env.rec.addDuration("burst", sys.name, "published", r.published, params)
		}
		env.rec.add("burst", sys.name, "received", float64(r.received), "items", params)
	}
	t := newTable("system", "received", "published (from T)", "drain (from T)", "after T+1s", "item p50", "item p99", "item max", "load", "vs retryd")
	for _, sys := range systems {
		r := res[sys.name]
		published := "-"
		if r.published > 0 {
			published = ms(r.published)
		}
		t.row(sys.name, fmt.Sprintf("%d/%d", r.received, r.n), published, ms(r.drain), ms(r.after), ms(r.lat.P50), ms(r.lat.P99), ms(r.lat.Max),
			r.loadTime.Round(100*time.Millisecond).String(), ratioLower(res["retryd"].drain, r.drain))
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	if rd, ok := res["retryd"]; ok {
		// The target is the scheduler's: the time to publish the burst.
		// The owner's receipt adds its consumer, on the same two cores; it
		// is held to the same bar and printed apart.
		all := rd.received == rd.n
		fmt.Fprintf(env.Out, "retryd published %s in %s (target < %s): %s\n", count(n), ms(rd.published), burstTarget,
			verdict(all && rd.published > 0 && rd.published < burstTarget))
		fmt.Fprintf(env.Out, "retryd's owner received %s in %s (same bar, end to end): %s", count(n), ms(rd.drain), verdict(all && rd.drain < burstTarget))
		sep := " — "
		for _, sys := range systems[1:] {
			fmt.Fprintf(env.Out, "%s%s %s", sep, sys.name, ms(res[sys.name].drain))
			sep = ", "
		}
		fmt.Fprintln(env.Out)
		rd.cost.print(env.Out, env.rec, n)
	}
	fmt.Fprintln(env.Out, "durability:")
	for _, sys := range systems {
		fmt.Fprintf(env.Out, "  %-15s %s\n", sys.name, res[sys.name].durability)
	}
	return nil
}
