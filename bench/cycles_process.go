package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// The systems named retryd-process run retryd as deploy/ runs it (issue
// 18, part 4): the retryd-scheduler binary in a process of its own, with
// its default configuration (the jobs API and projection and the
// dashboard on, shard 0), the owner acknowledging each due as for the
// in-process scheduler. Its tuning variables come from the environment,
// as for every child the bench starts.

// startRetrydProcess starts retryd's backends and the scheduler binary;
// stop stops both.
func startRetrydProcess(ctx context.Context, env Env) (_ *retrydSys, stop func(), err error) {
	bin, err := schedulerBinary(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	r, err := startRetryd(ctx, env, true)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			r.close(ctx)
		}
	}()
	logDir, err := os.MkdirTemp("", "retryd-bench-logs-")
	if err != nil {
		return nil, nil, fmt.Errorf("create log dir: %w", err)
	}
	cleanupDirs.add(logDir)
	proc, err := startSchedProc(bin, r.db.url, r.ns.url(), logDir)
	if err != nil {
		return nil, nil, err
	}
	if err := proc.waitReady(ctx, 60*time.Second); err != nil {
		proc.stop(30 * time.Second)
		return nil, nil, err
	}
	return r, func() {
		proc.stop(30 * time.Second)
		r.close(ctx)
	}, nil
}

func retrydProcessCycles(ctx context.Context, env Env, window int, warmup, dur time.Duration) (cycleResult, error) {
	r, stop, err := startRetrydProcess(ctx, env)
	if err != nil {
		return cycleResult{}, err
	}
	defer stop()
	res, err := r.cycles(ctx, window, warmup, dur)
	if err != nil {
		return cycleResult{}, err
	}
	// The cost probe reads the bench process and Postgres; the
	// scheduler's CPU is its own process's and is not in those figures.
	res.costNotes = append(res.costNotes, "retryd-process: the scheduler runs as a child process, so its CPU is missing from the bench-process rows")
	return res, nil
}

func retrydProcessBurst(ctx context.Context, env Env, n int) (burstResult, error) {
	r, stop, err := startRetrydProcess(ctx, env)
	if err != nil {
		return burstResult{}, err
	}
	defer stop()
	return r.burst(ctx, n, false)
}
