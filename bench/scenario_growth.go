package main

import (
	"context"
	"fmt"
	"time"

	"github.com/retryd/retryd/internal/streams"
)

func init() {
	register("growth", "lateness and cycle rate as retry_history grows (bulk-loaded), autovacuum at defaults", runGrowth)
}

type growthStep struct {
	history      int64 // rows in retry_history when the step was measured
	historyBytes int64
	loadTime     time.Duration
	cycles       cycleResult
	lat          latenessResult
}

func runGrowth(ctx context.Context, env Env) error {
	s := env.Sizes
	r, err := startRetryd(ctx, env, false)
	if err != nil {
		return err
	}
	defer r.close(ctx)
	stopBG, err := r.background(ctx, s.GrowthPending)
	if err != nil {
		return err
	}
	defer stopBG()
	fmt.Fprintf(env.Out, "%s pending in the background; per history size: cycles for %s (%d in flight), then the %d/s probe for %s; history loaded with INSERT ... generate_series in 1M-row statements\n",
		count(s.GrowthPending), s.GrowthFor, s.CycleWindow, s.Probe.rate, s.GrowthFor)

	if err := warmGrowth(ctx, env, r); err != nil {
		return err
	}
	var steps []growthStep
	var loaded int64
	spec := s.Probe
	spec.dur = s.GrowthFor
	spec.warmup = min(spec.warmup, spec.dur/2)
	for _, target := range s.HistorySizes {
		var st growthStep
		var have int64
		if err := r.db.pool.QueryRow(ctx, "SELECT count(*) FROM retry_history").Scan(&have); err != nil {
			return fmt.Errorf("count history: %w", err)
		}
		if int64(target) > have {
			start := time.Now()
			if err := loadHistory(ctx, r.db.pool, loaded, loaded+int64(target)-have); err != nil {
				return err
			}
			loaded += int64(target) - have
			st.loadTime = time.Since(start)
		}
		// retry_history is partitioned (00109): its own size is 0, its
		// partitions hold the bytes.
		if err := r.db.pool.QueryRow(ctx, `SELECT count(*), (SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('retry_history'))
FROM retry_history`).Scan(&st.history, &st.historyBytes); err != nil {
			return fmt.Errorf("count history: %w", err)
		}
		if st.cycles, err = r.cycles(ctx, s.CycleWindow, 2*time.Second, s.GrowthFor); err != nil {
			return fmt.Errorf("cycles at %d history rows: %w", st.history, err)
		}
		if _, err := r.settle(ctx, 2*time.Minute); err != nil {
			return err
		}
		if st.lat, err = r.probe(ctx, spec); err != nil {
			return fmt.Errorf("probe at %d history rows: %w", st.history, err)
		}
		steps = append(steps, st)
		params := map[string]any{"history": st.history}
		env.rec.add("growth", "retryd", "cycles_per_s", st.cycles.rate, "1/s", params)
		env.rec.addDuration("growth", "retryd", "p99", st.lat.lat.P99, params)
		fmt.Fprintf(env.Out, "  history %s: %.0f cycles/s, p99 lateness %s\n", fmtRows(st.history), st.cycles.rate, ms(st.lat.lat.P99))
	}
	t := newTable("history rows", "history size", "load", "cycles/s", "vs first", "p50", "p99", "max", "probe received")
	for _, st := range steps {
		t.row(fmtRows(st.history), bytesIEC(float64(st.historyBytes)), st.loadTime.Round(time.Second).String(),
			fmt.Sprintf("%.0f", st.cycles.rate), ratioHigher(st.cycles.rate, steps[0].cycles.rate),
			ms(st.lat.lat.P50), ms(st.lat.lat.P99), ms(st.lat.lat.Max), fmt.Sprintf("%d/%d", st.lat.received, st.lat.expected))
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	last := steps[len(steps)-1]
	fmt.Fprintf(env.Out, "at %s history rows: p99 lateness %s (target < %s): %s; cycle rate %s of the empty-history rate\n",
		fmtRows(last.history), ms(last.lat.lat.P99), ms(latenessTarget), verdict(last.lat.lat.P99 < latenessTarget && last.lat.lat.N > 0),
		ratioHigher(last.cycles.rate, steps[0].cycles.rate))
	var av string
	_ = r.db.pool.QueryRow(ctx, "SELECT current_setting('autovacuum')").Scan(&av)
	fmt.Fprintf(env.Out, "autovacuum=%s (defaults); durability: %s\n", av, r.durability(ctx))
	return nil
}

func fmtRows(n int64) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1_000:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// warmGrowth runs cycles unmeasured for Sizes.GrowthWarmup, then empties
// retry_history. Without it the first (empty) size was measured before
// steady state (the first 20 s of cycles on fresh streams and tables,
// RETRIES' 2-minute duplicate window not yet full), and every later size
// was compared with it as if history had made the difference: sizes
// 0,0,0 ran at 1x, 0.75x, 0.66x (2026-11-26, 21:38 UTC) with no history
// loaded at all, and at 1x, 0.99x, 0.99x after the warm-up.
func warmGrowth(ctx context.Context, env Env, r *retrydSys) error {
	d := env.Sizes.GrowthWarmup
	if d <= 0 {
		return nil
	}
	start := time.Now()
	res, err := r.cycles(ctx, env.Sizes.CycleWindow, 2*time.Second, d)
	if err != nil {
		return fmt.Errorf("warm up: %w", err)
	}
	if _, err := r.settle(ctx, 2*time.Minute); err != nil {
		return err
	}
	if _, err := r.db.pool.Exec(ctx, "TRUNCATE retry_history"); err != nil {
		return fmt.Errorf("empty history after the warm-up: %w", err)
	}
	full := "RETRIES' duplicate window filled"
	if d < streams.DuplicateWindow {
		full = fmt.Sprintf("shorter than RETRIES' %s duplicate window: not steady state", streams.DuplicateWindow)
	}
	fmt.Fprintf(env.Out, "  warm-up: %.0f cycles/s for %s, unmeasured (%s); retry_history emptied (%s in all)\n",
		res.rate, d, full, time.Since(start).Round(time.Second))
	return nil
}
