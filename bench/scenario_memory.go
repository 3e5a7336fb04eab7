package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

func init() {
	register("memory", "scheduler RSS (child process, while emitting) and Postgres bytes per pending retry at several pending counts", runMemory)
}

// memoryTarget: RSS at the largest size within 20% of RSS at the smallest.
const memoryTarget = 0.20

type memoryResult struct {
	pending                  int
	rssMax, rssEnd           int64
	tableBytes, heap, index  int64
	lateP99                  time.Duration
	probeReceived, probeSent int
}

func runMemory(ctx context.Context, env Env) error {
	s := env.Sizes
	bin, err := schedulerBinary(ctx, env)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Out, "per size: COPY the pending rows (over the next hour), start retryd-scheduler, run the %d/s probe for %s sampling VmRSS every 100 ms\n",
		s.Probe.rate, s.MemoryFor)
	var res []memoryResult
	for _, n := range s.MemorySizes {
		m, err := memoryAt(ctx, env, bin, n)
		if err != nil {
			return fmt.Errorf("%d pending: %w", n, err)
		}
		res = append(res, m)
		params := map[string]any{"pending": n}
		env.rec.add("memory", "retryd", "rss_max", float64(m.rssMax), "bytes", params)
		env.rec.add("memory", "retryd", "bytes_per_pending", float64(m.tableBytes)/float64(max(n, 1)), "bytes", params)
	}
	t := newTable("pending", "RSS max", "RSS end", "retries total", "heap", "indexes", "bytes/pending", "probe p99 lateness", "probe received")
	for _, m := range res {
		per := "-"
		if m.pending > 0 {
			per = fmt.Sprintf("%.0f", float64(m.tableBytes)/float64(m.pending))
		}
		t.row(count(m.pending), bytesIEC(float64(m.rssMax)), bytesIEC(float64(m.rssEnd)), bytesIEC(float64(m.tableBytes)),
			bytesIEC(float64(m.heap)), bytesIEC(float64(m.index)), per, ms(m.lateP99), fmt.Sprintf("%d/%d", m.probeReceived, m.probeSent))
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	if len(res) >= 2 {
		lo, hi := res[0], res[len(res)-1]
		growth := float64(hi.rssMax)/float64(lo.rssMax) - 1
		fmt.Fprintf(env.Out, "RSS at %s is %+.0f%% of RSS at %s (target within %.0f%%): %s\n",
			count(hi.pending), growth*100, count(lo.pending), memoryTarget*100, verdict(growth <= memoryTarget))
	}
	fmt.Fprintln(env.Out, "bytes/pending = pg_total_relation_size('retries') / rows right after COPY (heap + 5 indexes + TOAST); peers keep pending retries elsewhere (NakWithDelay: consumer state in server memory; River: river_job)")
	return nil
}

func memoryAt(ctx context.Context, env Env, bin string, n int) (memoryResult, error) {
	m := memoryResult{pending: n}
	r, err := startRetryd(ctx, env, true)
	if err != nil {
		return m, err
	}
	defer r.close(ctx)
	if err := copyPending(ctx, r.db.pool, pendingRows{kind: kindBG, n: n, from: backgroundStart(n), span: time.Hour}); err != nil {
		return m, err
	}
	err = r.db.pool.QueryRow(ctx, `SELECT pg_total_relation_size('retries'), pg_relation_size('retries'), pg_indexes_size('retries')`).
		Scan(&m.tableBytes, &m.heap, &m.index)
	if err != nil {
		return m, fmt.Errorf("measure retries table: %w", err)
	}
	logDir, err := os.MkdirTemp("", "retryd-bench-logs-")
	if err != nil {
		return m, err
	}
	cleanupDirs.add(logDir)
	proc, err := startSchedProc(bin, r.db.url, r.ns.url(), logDir)
	if err != nil {
		return m, err
	}
	defer proc.stop(30 * time.Second)
	if err := proc.waitReady(ctx, 60*time.Second); err != nil {
		return m, err
	}
	stopBG, err := r.ownBackground(ctx, kindBG)
	if err != nil {
		return m, err
	}
	defer stopBG()

	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan error, 1)
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			rss, err := proc.rss()
			if err != nil {
				sampled <- err
				return
			}
			m.rssMax, m.rssEnd = max(m.rssMax, rss), rss
			select {
			case <-sampleCtx.Done():
				sampled <- nil
				return
			case <-t.C:
			}
		}
	}()
	spec := env.Sizes.Probe
	spec.dur = env.Sizes.MemoryFor
	spec.warmup = min(spec.warmup, spec.dur/2)
	lat, err := r.probe(ctx, spec)
	stopSampling()
	if serr := <-sampled; serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return m, err
	}
	m.lateP99, m.probeReceived, m.probeSent = lat.lat.P99, lat.received, lat.expected
	return m, nil
}
