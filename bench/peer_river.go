package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

// River is the nearest Go + Postgres equivalent of retryd: a job queue
// whose failed jobs are retried by its retry policy. It runs in the bench
// process, as River runs inside its user's process.

// River is tuned for throughput, as its user would for this workload.
// A producer fetches at most MaxWorkers minus the running jobs, at most
// once per FetchCooldown: with 1,000 workers and the default 100 ms
// cooldown River tops out near 10,000 job runs (5,000 cycles) a second
// whatever the database could do, so trial runs settled on 10,000 workers
// and a 20 ms cooldown (the jobs themselves do nothing).
const (
	riverMaxWorkers    = 10_000
	riverFetchCooldown = 20 * time.Millisecond
)

// riverFetchPoll is River's FetchPollInterval. A job retried after 100 ms
// is set back to available with scheduled_at in the future, and River
// finds such jobs by polling (inserts also wake it): the default 1 s poll
// would add up to a second to every retry, so the bench uses 100 ms, what
// a user asking for 100 ms retries would set.
const riverFetchPoll = 100 * time.Millisecond

type benchJobArgs struct {
	// At is when the job is meant to run (burst), unix nanoseconds.
	At int64 `json:"at,omitempty"`
}

func (benchJobArgs) Kind() string { return "bench" }

type benchWorker struct {
	river.WorkerDefaults[benchJobArgs]
	work func(*river.Job[benchJobArgs]) error
}

func (w *benchWorker) Work(_ context.Context, job *river.Job[benchJobArgs]) error {
	return w.work(job)
}

// fixedRetry retries after the same delay every time.
type fixedRetry struct{ d time.Duration }

func (p fixedRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(p.d) }

var errBenchRetryable = errors.New("temporary: upstream unavailable")

type riverSys struct {
	pg     *pgServer
	db     string
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
}

// newRiver creates a database, runs River's migrations and a client whose
// worker runs work for every job.
func newRiver(ctx context.Context, pg *pgServer, work func(*river.Job[benchJobArgs]) error) (*riverSys, error) {
	r := &riverSys{pg: pg, db: dbName("river")}
	url, err := pg.createDB(ctx, r.db)
	if err != nil {
		return nil, err
	}
	if r.pool, err = newPool(ctx, url, 40); err != nil {
		return nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	migrator, err := rivermigrate.New(riverpgxv5.New(r.pool), &rivermigrate.Config{Logger: quiet})
	if err != nil {
		r.close(ctx)
		return nil, fmt.Errorf("new river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		r.close(ctx)
		return nil, fmt.Errorf("migrate river: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &benchWorker{work: work})
	r.client, err = river.NewClient(riverpgxv5.New(r.pool), &river.Config{
		Logger:            quiet,
		FetchCooldown:     riverFetchCooldown,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverMaxWorkers}},
		Workers:           workers,
		RetryPolicy:       fixedRetry{d: cycleDelay},
		FetchPollInterval: riverFetchPoll,
		MaxAttempts:       5,
	})
	if err != nil {
		r.close(ctx)
		return nil, fmt.Errorf("new river client: %w", err)
	}
	return r, nil
}

func (r *riverSys) start(ctx context.Context) (err error) {
	labelled(ctx, compRiver, func(ctx context.Context) { err = r.client.Start(ctx) })
	if err != nil {
		return fmt.Errorf("start river: %w", err)
	}
	return nil
}

func (r *riverSys) close(ctx context.Context) {
	if r.client != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = r.client.Stop(stopCtx)
		cancel()
	}
	if r.pool != nil {
		r.pool.Close()
	}
	r.pg.dropDB(context.WithoutCancel(ctx), r.db)
}

func (r *riverSys) durability(ctx context.Context) string {
	return "Postgres " + durability(ctx, r.pool)
}

func (r *riverSys) insert(ctx context.Context, args []benchJobArgs, scheduledAt func(i int) time.Time) error {
	const batch = 5000
	for lo := 0; lo < len(args); lo += batch {
		hi := min(lo+batch, len(args))
		params := make([]river.InsertManyParams, 0, hi-lo)
		for i := lo; i < hi; i++ {
			p := river.InsertManyParams{Args: args[i]}
			if scheduledAt != nil {
				p.InsertOpts = &river.InsertOpts{ScheduledAt: scheduledAt(i)}
			}
			params = append(params, p)
		}
		if _, err := r.client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("insert river jobs: %w", err)
		}
	}
	return nil
}

// riverCycles runs the cycle workload on River: jobs fail on attempt 1,
// River retries them after 100 ms, attempt 2 succeeds. A completed job
// (the completion committed, as River's job_completed event reports) is
// a cycle; each one is replaced by a new job, keeping window in flight.
func riverCycles(ctx context.Context, env Env, window int, warmup, dur time.Duration) (cycleResult, error) {
	r, err := newRiver(ctx, env.pg, func(job *river.Job[benchJobArgs]) error {
		if job.Attempt == 1 {
			return errBenchRetryable
		}
		return nil
	})
	if err != nil {
		return cycleResult{}, err
	}
	defer r.close(ctx)
	events, cancelSub := r.client.SubscribeConfig(&river.SubscribeConfig{
		Kinds: []river.EventKind{river.EventKindJobCompleted}, ChanSize: 4 * window,
	})
	defer cancelSub()
	if err := r.start(ctx); err != nil {
		return cycleResult{}, err
	}

	var need atomic.Int64
	meter := newCycleMeter(window, warmup, dur)
	finishCost, abortCost := measureCost(ctx, env, meter, r.db, nil, "River")
	defer abortCost()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case ev := <-events:
				if ev == nil {
					return
				}
				meter.done(ev.Job.CreatedAt)
				need.Add(1)
			}
		}
	}()
	insertErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				insertErr <- nil
				return
			case <-t.C:
			}
			if n := need.Swap(0); n > 0 && !meter.finished() {
				if err := r.insert(runCtx, make([]benchJobArgs, n), nil); err != nil && runCtx.Err() == nil {
					insertErr <- err
					return
				}
			}
		}
	}()
	meter.start()
	if err := r.insert(ctx, make([]benchJobArgs, window), nil); err != nil {
		return cycleResult{}, err
	}
	if err := meter.await(ctx, insertErr); err != nil {
		return cycleResult{}, err
	}
	res := meter.result()
	finishCost(&res)
	res.durability = r.durability(ctx)
	return res, nil
}

// riverBurst inserts n jobs scheduled within one second and times how
// long River takes to work them all. River moves scheduled jobs to
// available in its scheduler maintenance loop (every 5 s by default, on
// the elected leader), then the producers fetch them.
func riverBurst(ctx context.Context, env Env, n int) (burstResult, error) {
	br := newBurstRecorder(n)
	r, err := newRiver(ctx, env.pg, func(job *river.Job[benchJobArgs]) error {
		br.received1(time.Unix(0, job.Args.At), time.Now())
		return nil
	})
	if err != nil {
		return burstResult{}, err
	}
	defer r.close(ctx)
	if err := r.start(ctx); err != nil {
		return burstResult{}, err
	}
	t0, _ := br.startLoad(10_000)
	args := make([]benchJobArgs, n)
	for i := range args {
		args[i].At = t0.Add(time.Duration(i) * time.Second / time.Duration(n)).UnixNano()
	}
	if err := r.insert(ctx, args, func(i int) time.Time { return time.Unix(0, args[i].At) }); err != nil {
		return burstResult{}, err
	}
	res, err := br.loaded(ctx)
	if err != nil {
		return burstResult{}, err
	}
	res.durability = r.durability(ctx)
	return res, nil
}
