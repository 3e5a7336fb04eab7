package main

import (
	"context"
	"fmt"
	"time"
)

func init() {
	register("burst", "N retries due in the same second: time until the owner has every due event (retryd, River, NakWithDelay, schedules)", runBurst)
}

type burstSystem struct {
	name string
	run  func(ctx context.Context, env Env, n int) (burstResult, error)
}

var burstSystems = []burstSystem{
	{"retryd", retrydBurst},
	{"River", riverBurst},
	{"NakWithDelay", nakBurst},
	{"schedules", schedulesBurst},
}

const burstTarget = 3 * time.Second

func runBurst(ctx context.Context, env Env) error {
	n := env.Sizes.Burst
	fmt.Fprintf(env.Out, "%s items due evenly within one second T..T+1s, loaded ahead of T; drain = last received - T\n", count(n))
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
		env.rec.add("burst", sys.name, "received", float64(r.received), "items", params)
	}
	t := newTable("system", "received", "drain (from T)", "after T+1s", "item p50", "item p99", "item max", "load", "vs retryd")
	for _, sys := range systems {
		r := res[sys.name]
		t.row(sys.name, fmt.Sprintf("%d/%d", r.received, r.n), ms(r.drain), ms(r.after), ms(r.lat.P50), ms(r.lat.P99), ms(r.lat.Max),
			r.loadTime.Round(100*time.Millisecond).String(), ratioLower(res["retryd"].drain, r.drain))
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	if rd, ok := res["retryd"]; ok {
		met := rd.received == rd.n && rd.drain < burstTarget
		fmt.Fprintf(env.Out, "retryd drained %s in %s (target < %s): %s", count(n), ms(rd.drain), burstTarget, verdict(met))
		sep := " — "
		for _, sys := range systems[1:] {
			fmt.Fprintf(env.Out, "%s%s %s", sep, sys.name, ms(res[sys.name].drain))
			sep = ", "
		}
		fmt.Fprintln(env.Out)
	}
	fmt.Fprintln(env.Out, "durability:")
	for _, sys := range systems {
		fmt.Fprintf(env.Out, "  %-13s %s\n", sys.name, res[sys.name].durability)
	}
	return nil
}
