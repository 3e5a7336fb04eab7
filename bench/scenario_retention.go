package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/stores/retention"
)

func init() {
	register("retention", "due lateness while retention drops old retry_history day partitions, against a window without a drop", runRetention)
}

const (
	// retentionDroppedDays are the day partitions wholly older than the
	// retention, each loaded with Sizes.RetentionRows.
	retentionDroppedDays = 3
	// retentionKeptDays are the days before today that hold the retained
	// rows (another Sizes.RetentionRows in all), well inside the
	// retention so none of them reaches its cutoff during the run.
	retentionKeptDays = 28
)

// retentionLayout is retry_history as a deployment that has run
// maintenance daily for longer than the retention has it: one partition
// per UTC day, each row in its day's partition as it was written.
type retentionLayout struct {
	today time.Time // UTC midnight
	keep  time.Duration
}

func newRetentionLayout(now time.Time, keep time.Duration) retentionLayout {
	return retentionLayout{today: now.UTC().Truncate(24 * time.Hour), keep: keep}
}

func (l retentionLayout) dayStart(daysAgo int) time.Time {
	return l.today.Add(-time.Duration(daysAgo) * 24 * time.Hour)
}

// droppedDays are the first days of the partitions a run drops: those
// whose range ends at or before now - keep, loaded with rows.
func (l retentionLayout) droppedDays() []time.Time {
	keepDays := int(l.keep / (24 * time.Hour))
	out := make([]time.Time, 0, retentionDroppedDays)
	for i := 1; i <= retentionDroppedDays; i++ {
		out = append(out, l.dayStart(keepDays+i))
	}
	return out
}

// oldEnd is where the dropped rows end: the upper bound of the newest
// dropped partition.
func (l retentionLayout) oldEnd() time.Time { return l.droppedDays()[0].Add(24 * time.Hour) }

// keptFrom and keptTo bound the retained rows the scenario loads (live
// traffic writes at today or later, so it never counts among them).
func (l retentionLayout) keptFrom() time.Time { return l.dayStart(retentionKeptDays) }
func (l retentionLayout) keptTo() time.Time   { return l.today }

func dayPartName(d time.Time) string { return "retry_history_p" + d.UTC().Format("20060102") }

// prepare replaces 00109's legacy partition (MINVALUE to tomorrow, empty
// in a fresh database; retention drops it once its range is past the
// retention, so a deployment older than that has none) with one partition
// per day from the oldest dropped day through today, named and bounded as
// retention creates them.
func (l retentionLayout) prepare(ctx context.Context, r *retrydSys) error {
	var legacy int64
	if err := r.db.pool.QueryRow(ctx, `SELECT count(*) FROM retry_history_legacy`).Scan(&legacy); err != nil {
		return fmt.Errorf("count legacy history: %w", err)
	}
	if legacy != 0 {
		return fmt.Errorf("prepare partitions: retry_history_legacy holds %d rows, want a fresh database", legacy)
	}
	if _, err := r.db.pool.Exec(ctx, `DROP TABLE retry_history_legacy`); err != nil {
		return fmt.Errorf("drop legacy history partition: %w", err)
	}
	oldest := int(l.keep/(24*time.Hour)) + retentionDroppedDays
	for ago := oldest; ago >= 0; ago-- {
		d := l.dayStart(ago)
		stmt := fmt.Sprintf(`CREATE TABLE %s PARTITION OF retry_history FOR VALUES FROM ('%s') TO ('%s')`,
			pgx.Identifier{dayPartName(d)}.Sanitize(), d.Format(time.RFC3339), d.Add(24*time.Hour).Format(time.RFC3339))
		if _, err := r.db.pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create partition %s: %w", dayPartName(d), err)
		}
	}
	return nil
}

// load fills each dropped day with perDay rows and spreads perDay more
// over the retained days, then vacuums them as autovacuum long since
// would have.
func (l retentionLayout) load(ctx context.Context, r *retrydSys, perDay int64) error {
	var next int64
	for _, d := range l.droppedDays() {
		if err := loadHistorySpan(ctx, r.db.pool, next, next+perDay, d, 24*time.Hour); err != nil {
			return err
		}
		next += perDay
	}
	if err := loadHistorySpan(ctx, r.db.pool, next, next+perDay, l.keptFrom(), l.keptTo().Sub(l.keptFrom())); err != nil {
		return err
	}
	if _, err := r.db.pool.Exec(ctx, `VACUUM (ANALYZE) retry_history`); err != nil {
		return fmt.Errorf("vacuum history: %w", err)
	}
	return nil
}

type retentionCounts struct{ old, kept int64 }

func (l retentionLayout) count(ctx context.Context, r *retrydSys) (retentionCounts, error) {
	var c retentionCounts
	err := r.db.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM retry_history WHERE at < $1),
       (SELECT count(*) FROM retry_history WHERE at >= $2 AND at < $3)`,
		l.oldEnd(), l.keptFrom(), l.keptTo()).Scan(&c.old, &c.kept)
	if err != nil {
		return c, fmt.Errorf("count history: %w", err)
	}
	return c, nil
}

// dueSamples are the probe items as the owner received them.
type dueSamples struct {
	mu sync.Mutex
	s  []dueSample
}

// dueSample is one probe item: when it was reported failed and came due,
// its lateness and its end-to-end time past the delay.
type dueSample struct {
	published, due time.Time
	late, e2e      time.Duration
}

func (d *dueSamples) add(s dueSample) {
	d.mu.Lock()
	d.s = append(d.s, s)
	d.mu.Unlock()
}

// between summarizes lateness and e2e of the items whose time (by: their
// due or report time) is in [from, to].
func (d *dueSamples) between(from, to time.Time, by func(dueSample) time.Time) (late, e2e summary) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var l, e []time.Duration
	for _, s := range d.s {
		if t := by(s); !t.Before(from) && !t.After(to) {
			l, e = append(l, s.late), append(e, s.e2e)
		}
	}
	return summarize(l), summarize(e)
}

func byDue(s dueSample) time.Time      { return s.due }
func byReported(s dueSample) time.Time { return s.published }

// retentionRun is one retention.Run during the drop window.
type retentionRun struct {
	start, end time.Time
	rep        retention.Report
	err        error
}

func runRetention(ctx context.Context, env Env) error {
	s := env.Sizes
	r, err := startRetryd(ctx, env, true)
	if err != nil {
		return err
	}
	defer r.close(ctx)
	l := newRetentionLayout(time.Now(), retention.DefaultHistoryRetention)
	if err := l.prepare(ctx, r); err != nil {
		return err
	}
	loadStart := time.Now()
	perDay := int64(s.RetentionRows)
	if err := l.load(ctx, r, perDay); err != nil {
		return err
	}
	loadTime := time.Since(loadStart)
	before, err := l.count(ctx, r)
	if err != nil {
		return err
	}
	if before.old != retentionDroppedDays*perDay || before.kept != perDay {
		return fmt.Errorf("loaded %d old and %d retained history rows, want %d and %d", before.old, before.kept, retentionDroppedDays*perDay, perDay)
	}
	if err := r.startScheduler(ctx); err != nil {
		return err
	}
	stopBG, err := r.background(ctx, s.GrowthPending)
	if err != nil {
		return err
	}
	defer stopBG()
	spec := s.Probe
	offset := min(spec.warmup+2*time.Second, spec.dur/2)
	fmt.Fprintf(env.Out, "retry_history in UTC day partitions: %s rows in each of the %d days older than the %s retention, %s over the %d days before today (loaded in %s, vacuumed); %s pending in the background\n",
		fmtRows(perDay), retentionDroppedDays, retention.FormatDuration(l.keep), fmtRows(perDay), retentionKeptDays,
		loadTime.Round(time.Second), count(s.GrowthPending))
	fmt.Fprintf(env.Out, "the %d/s probe for %s twice: without a retention run, then with retention.Run (as `retryd maintenance`) started %s into the window\n",
		spec.rate, spec.dur, offset)

	if _, err := r.settle(ctx, 2*time.Minute); err != nil {
		return err
	}
	var base dueSamples
	baseStart := time.Now()
	baseRes, err := r.probeObserved(ctx, spec, base.add)
	if err != nil {
		return fmt.Errorf("probe without a drop: %w", err)
	}
	if _, err := r.settle(ctx, 2*time.Minute); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, r.db.url)
	if err != nil {
		return fmt.Errorf("connect for retention: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var drop dueSamples
	done := make(chan retentionRun, 1)
	dropStart := time.Now()
	go func() {
		select {
		case <-time.After(offset):
		case <-ctx.Done():
			done <- retentionRun{err: ctx.Err()}
			return
		}
		run := retentionRun{start: time.Now()}
		run.rep, run.err = retention.Run(ctx, conn, retention.Options{Keep: map[string]time.Duration{"retry_history": l.keep}}, zerolog.Nop())
		run.end = time.Now()
		done <- run
	}()
	dropRes, err := r.probeObserved(ctx, spec, drop.add)
	run := <-done // conn is the goroutine's until then
	if err != nil {
		return fmt.Errorf("probe during the drop: %w", err)
	}
	if run.err != nil {
		return fmt.Errorf("retention run: %w", run.err)
	}
	dropped, err := checkRetention(ctx, r, l, run.rep, before)
	if err != nil {
		return err
	}
	took := run.end.Sub(run.start)

	type row struct {
		window, items string
		lat, e2e      summary
		res           latenessResult
	}
	mk := func(window, items string, res latenessResult, d *dueSamples, from, to time.Time, by func(dueSample) time.Time) row {
		lat, e2e := d.between(from, to, by)
		return row{window, items, lat, e2e, res}
	}
	// A report the scheduler applies while the drop holds retry_history's
	// lock is scheduled late, and its delay counts from then: that shows in
	// e2e, not in lateness, hence the row by report time.
	rows := []row{
		mk("no drop", "all", baseRes, &base, baseStart, baseStart.Add(time.Hour), byDue),
		mk("no drop", "due at the drop's offsets", baseRes, &base, baseStart.Add(run.start.Sub(dropStart)), baseStart.Add(run.end.Sub(dropStart)), byDue),
		mk("drop", "all", dropRes, &drop, dropStart, dropStart.Add(time.Hour), byDue),
		mk("drop", "due during the drop", dropRes, &drop, run.start, run.end, byDue),
		mk("drop", "reported failed during the drop", dropRes, &drop, run.start, run.end, byReported),
	}
	t := newTable("window", "items", "n", "p50", "p99", "max", "e2e p50", "e2e p99", "probe received")
	for _, row := range rows {
		t.row(row.window, row.items, fmt.Sprint(row.lat.N), msOrDash(row.lat, row.lat.P50), msOrDash(row.lat, row.lat.P99),
			msOrDash(row.lat, row.lat.Max), msOrDash(row.e2e, row.e2e.P50), msOrDash(row.e2e, row.e2e.P99),
			fmt.Sprintf("%d/%d", row.res.received, row.res.expected))
		if row.lat.N == 0 {
			continue
		}
		params := map[string]any{"window": row.window, "items": row.items, "rows_per_dropped_day": perDay,
			"dropped_days": retentionDroppedDays, "probe_rate": spec.rate}
		env.rec.addDuration("retention", "retryd", "p50", row.lat.P50, params)
		env.rec.addDuration("retention", "retryd", "p99", row.lat.P99, params)
		env.rec.addDuration("retention", "retryd", "max", row.lat.Max, params)
		env.rec.addDuration("retention", "retryd", "e2e_p99", row.e2e.P99, params)
		env.rec.add("retention", "retryd", "items", float64(row.lat.N), "items", params)
	}
	env.rec.addDuration("retention", "retryd", "run_duration", took,
		map[string]any{"rows_per_dropped_day": perDay, "dropped_days": retentionDroppedDays})
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	fmt.Fprintf(env.Out, "retention.Run started %s into the window and took %s; it dropped %v (%s rows); %s retained rows before and after, dropped partitions gone\n",
		run.start.Sub(dropStart).Round(time.Millisecond), took.Round(time.Millisecond), dropped, fmtRows(before.old), fmtRows(before.kept))
	during := rows[3].lat
	fmt.Fprintf(env.Out, "p99 lateness of the dues during the drop %s, of the window without a drop %s (target < %s): %s\n",
		msOrDash(during, during.P99), ms(rows[0].lat.P99), ms(latenessTarget), verdict(rows[2].lat.P99 < latenessTarget && rows[2].lat.N > 0))
	fmt.Fprintf(env.Out, "durability: %s\n", r.durability(ctx))
	return nil
}

// checkRetention fails unless the run dropped the loaded old partitions
// (and they are gone), no row older than the retention is left, and
// every retained row is still there. It returns the partitions dropped.
func checkRetention(ctx context.Context, r *retrydSys, l retentionLayout, rep retention.Report, before retentionCounts) ([]string, error) {
	var dropped []string
	for _, t := range rep.Tables {
		if t.Table == "retry_history" {
			dropped = t.Dropped
		}
	}
	for _, d := range l.droppedDays() {
		name := dayPartName(d)
		if !slices.Contains(dropped, name) {
			return nil, fmt.Errorf("retention run dropped %v, not %s", dropped, name)
		}
		var gone bool
		if err := r.db.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, name).Scan(&gone); err != nil {
			return nil, fmt.Errorf("look up partition %s: %w", name, err)
		}
		if !gone {
			return nil, fmt.Errorf("partition %s is still there after the retention run", name)
		}
	}
	after, err := l.count(ctx, r)
	if err != nil {
		return nil, err
	}
	if after.old != 0 {
		return nil, fmt.Errorf("%d history rows older than the retention left after the run", after.old)
	}
	if after.kept != before.kept {
		return nil, fmt.Errorf("retained history rows: %d after the run, %d before", after.kept, before.kept)
	}
	return dropped, nil
}

// msOrDash is ms of d, or "-" when s holds no sample.
func msOrDash(s summary, d time.Duration) string {
	if s.N == 0 {
		return "-"
	}
	return ms(d)
}
