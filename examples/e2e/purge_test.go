package e2e_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	slogzerolog "github.com/samber/slog-zerolog/v2"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/worker"
	"github.com/retryd/retryd/services/scheduler"
)

// purgeJobs is how many failures the purge test loses and gets back:
// issue 16's 10,000, or 1,000 with -short. E2E_PURGE_JOBS overrides both.
func purgeJobs(t *testing.T) int {
	if s := os.Getenv("E2E_PURGE_JOBS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "E2E_PURGE_JOBS")
		return n
	}
	if testing.Short() {
		return 1_000
	}
	return 10_000
}

// TestPurgeBeforeTheSchedulerReadsLosesNoFailure is issue 16's acceptance:
// a purge of RETRIES before the scheduler has read 10,000 job failures
// ends with all 10,000 decided exactly once. The workers keep each failed
// fact until its decision and publish it again once it has left the
// stream; RETRIES gets a 1 s duplicate window so that this takes seconds,
// not minutes.
func TestPurgeBeforeTheSchedulerReadsLosesNoFailure(t *testing.T) {
	t.Parallel()
	n := purgeJobs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	retries, err := js.Stream(ctx, contract.StreamRetries)
	require.NoError(t, err)
	cfg := retries.CachedInfo().Config
	cfg.Duplicates = time.Second
	retries, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	pool := pgtest.NewPool(t)
	// An hour's delay: every job stays scheduled for attempt 2, and the
	// count of decisions is the count of scheduled ones.
	_, err = pool.Exec(ctx, `UPDATE retry_policies SET base_delay_ms = 3600000, max_delay_ms = 3600000,
		jitter = 'none', jitter_ms = 0 WHERE kind = 'job'`)
	require.NoError(t, err)
	log := testLogger(t)

	// Two workers, each with its own connection and pending set.
	reg := prometheus.NewRegistry()
	for range 2 {
		_, wjs := natstest.Connect(t, srv)
		w, err := worker.New(worker.Config{
			JS: wjs, Logger: slog.New(slogzerolog.Option{Logger: &log, NoTimestamp: true}.NewZerologHandler()),
			Concurrency: 64, FetchWait: 200 * time.Millisecond, DisableDueRouter: true,
			RepublishAfter: 1500 * time.Millisecond, Registerer: reg,
		})
		require.NoError(t, err)
		require.NoError(t, w.Handle("sync_crm", func(context.Context, *worker.Job) error {
			return errors.New("crm: 503 service unavailable")
		}))
		require.NoError(t, w.Start(ctx))
		t.Cleanup(func() { stop(t, w.Stop) })
	}
	pending := func() float64 { return servicetest.Metric(t, reg, "retryd_worker_pending_facts") }

	enqueueMany(ctx, t, js, n)
	// Every failure on the stream, not only kept: a publish still in
	// flight at the purge would land after it and need no republish.
	require.Eventually(t, func() bool {
		info, err := retries.Info(ctx)
		return err == nil && info.State.Msgs == uint64(n) && pending() == float64(n)
	}, 2*time.Minute, 20*time.Millisecond, "every job failed and is kept")
	require.NoError(t, retries.Purge(ctx))

	sched, err := scheduler.New(scheduler.Config{
		Pool: pool, JS: js, Logger: log, Registerer: prometheus.NewRegistry(),
		MaxIdle: 100 * time.Millisecond, AckWait: 5 * time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, sched.Start(ctx))
	t.Cleanup(func() { stop(t, sched.Stop) })

	require.Eventually(t, func() bool { return pending() == 0 }, 3*time.Minute, 50*time.Millisecond,
		"every failure decided, and the decision seen by its worker")
	var rows, attempt2 int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'scheduled' AND attempt = 2)
		FROM retries WHERE kind = 'job'`).Scan(&rows, &attempt2))
	require.Equal(t, n, rows)
	require.Equal(t, n, attempt2, "every job scheduled for attempt 2")
	var failed, scheduled, items, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event = 'failed'),
		count(*) FILTER (WHERE event = 'scheduled' AND attempt = 2),
		count(DISTINCT item_id) FILTER (WHERE event = 'scheduled' AND attempt = 2),
		count(*) FILTER (WHERE event NOT IN ('failed', 'scheduled'))
		FROM retry_history WHERE kind = 'job'`).Scan(&failed, &scheduled, &items, &other))
	require.Equal(t, n, failed, "each failure applied once")
	require.Equal(t, n, scheduled, "each job decided once")
	require.Equal(t, n, items)
	require.Zero(t, other)

	// And on the stream: one scheduled fact per job.
	require.Eventually(t, func() bool {
		info, err := retries.Info(ctx, jetstream.WithSubjectFilter(contract.RetryFilter(contract.KindJob, contract.Scheduled)))
		return err == nil && len(info.State.Subjects) == n
	}, wait, 50*time.Millisecond)
	info, err := retries.Info(ctx, jetstream.WithSubjectFilter(contract.RetryFilter(contract.KindJob, contract.Scheduled)))
	require.NoError(t, err)
	for subj, count := range info.State.Subjects {
		require.Equal(t, uint64(1), count, subj)
	}
	require.GreaterOrEqual(t, servicetest.Metric(t, reg, "retryd_worker_republished_total"), float64(n),
		"every purged failure came back through its worker")
}

// enqueueMany publishes n jobs of type sync_crm from 16 goroutines.
func enqueueMany(ctx context.Context, t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				if _, err := worker.Enqueue(ctx, js, contract.JobData{JobType: "sync_crm"}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
}
