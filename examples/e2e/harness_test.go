package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	slogzerolog "github.com/samber/slog-zerolog/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/workertest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/worker"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// wait bounds every wait; the tests poll, never sleep.
const wait = 30 * time.Second

// retryController adapts the scheduler to jobs.RetryController: the
// wiring the binaries that host both use.
type retryController struct{ s *scheduler.Scheduler }

func (c retryController) RetryNow(ctx context.Context, kind, id, reason, by string, reset bool, errorClass string) error {
	_, err := c.s.RetryNow(ctx, kind, id, scheduler.RetryNowOptions{Reason: reason, By: by, ResetAttempts: reset, ErrorClass: errorClass})
	return err
}

func (c retryController) Cancel(ctx context.Context, kind, id, by, reason string) error {
	_, err := c.s.Cancel(ctx, kind, id, by, reason)
	return err
}

// env is retryd's jobs path in one process: embedded NATS, a fresh
// database, the real scheduler, the jobs projection and API, and an HTTP
// server with the jobs and policy routes.
type env struct {
	ctx   context.Context
	srv   *server.Server
	js    jetstream.JetStream
	pool  *pgxpool.Pool
	sched *scheduler.Scheduler
	http  *httptest.Server
	log   zerolog.Logger
}

func testLogger(t *testing.T) zerolog.Logger {
	if os.Getenv("E2E_LOG") != "" {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)
}

func setup(t *testing.T) *env {
	t.Helper()
	be := backendtest.Start(t, 3*time.Minute)
	ctx, js := be.Ctx, be.JS
	natstest.EnsureStreams(t, js)
	e := &env{ctx: ctx, srv: be.Srv, js: js, pool: be.Pool, log: testLogger(t)}

	// Fast policies for every job type the tests use: 100ms doubling, no
	// jitter, so delays are exact.
	_, err := e.pool.Exec(ctx, `UPDATE retry_policies SET base_delay_ms = 100, multiplier = 2,
		max_delay_ms = 2000, jitter = 'none', jitter_ms = 0 WHERE kind = 'job'`)
	require.NoError(t, err)

	sched, err := scheduler.New(scheduler.Config{
		Pool: e.pool, JS: js, Logger: e.log, Registerer: prometheus.NewRegistry(),
		MaxIdle: 100 * time.Millisecond, AckWait: 2 * time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, sched.Start(ctx))
	t.Cleanup(func() { stop(t, sched.Stop) })
	e.sched = sched

	proj, err := jobs.NewProjector(jobs.ProjectorConfig{Pool: e.pool, JS: js, Logger: e.log, FetchWait: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(func() { stop(t, proj.Stop) })

	api, err := jobs.NewAPI(jobs.APIConfig{Pool: e.pool, Retry: retryController{sched}, JS: js, Logger: e.log, ScanInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, api.Start(ctx))
	t.Cleanup(func() { stop(t, api.Stop) })

	mux := http.NewServeMux()
	api.Register(mux)
	mux.Handle("/v1/policies/", sched.Handler())
	mux.Handle("/v1/retries/", sched.Handler())
	// The API runs as alice, an admin: audit records name her.
	e.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(serve.WithPrincipal(r.Context(), serve.Principal{Name: "alice", Role: serve.RoleAdmin})))
	}))
	t.Cleanup(e.http.Close)
	return e
}

func stop(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, f(ctx))
}

// startWorker starts a worker with handlers on js (the env's connection
// unless cfg.JS is set); it is stopped in t.Cleanup.
func (e *env) startWorker(t *testing.T, cfg worker.Config, handlers map[string]worker.Handler) *worker.Worker {
	t.Helper()
	if cfg.JS == nil {
		cfg.JS = e.js
	}
	cfg.Logger = slog.New(slogzerolog.Option{Logger: &e.log, NoTimestamp: true}.NewZerologHandler())
	return workertest.Start(t, e.ctx, cfg, handlers)
}

// failingWorker starts a worker whose handler for jobType records each
// attempt and fails it with err.
func (e *env) failingWorker(t *testing.T, jobType string, err error) *attempts {
	t.Helper()
	seen := &attempts{}
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		jobType: func(_ context.Context, job *worker.Job) error {
			seen.add(job)
			return err
		},
	})
	return seen
}

func (e *env) enqueue(t *testing.T, job contract.JobData) string {
	t.Helper()
	id, err := worker.Enqueue(e.ctx, e.js, job)
	require.NoError(t, err)
	return id
}

// waitJob polls the jobs table until the job reaches status.
func (e *env) waitJob(t *testing.T, id string, status jobstore.Status) jobstore.Job {
	t.Helper()
	var last jobstore.Job
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		j, err := jobstore.Get(e.ctx, e.pool, id)
		if !assert.NoError(c, err) {
			return
		}
		last = j
		assert.Equal(c, status, j.Status, "job %s: %+v", id, j)
	}, wait, 10*time.Millisecond)
	return last
}

// projected waits until the jobs projection has applied everything on
// both of its streams: the row then holds every fact, not just the
// latest status.
func (e *env) projected(t *testing.T) {
	t.Helper()
	for _, stream := range []string{contract.StreamJobs, contract.StreamRetries} {
		require.Eventually(t, func() bool {
			c, err := e.js.Consumer(e.ctx, stream, jobs.ProjectionDurable)
			if err != nil {
				return false
			}
			info, err := c.Info(e.ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}, wait, 10*time.Millisecond, "projection behind on %s", stream)
	}
}

// events lists the lifecycle events of a job's history, in order.
func (e *env) history(t *testing.T, id string) []retrystore.HistoryEntry {
	t.Helper()
	h, err := retrystore.History(e.ctx, e.pool, contract.KindJob, id)
	require.NoError(t, err)
	return h
}

func events(h []retrystore.HistoryEntry) []string {
	out := make([]string, len(h))
	for i, x := range h {
		out[i] = x.Event
	}
	return out
}

// waitHistory polls until the job's history has n entries.
func (e *env) waitHistory(t *testing.T, id string, n int) []retrystore.HistoryEntry {
	t.Helper()
	var h []retrystore.HistoryEntry
	require.Eventually(t, func() bool {
		h = e.history(t, id)
		return len(h) >= n
	}, wait, 10*time.Millisecond, "history of %s: %v", id, events(h))
	return h
}

// call sends a JSON request to the env's HTTP server and decodes the
// answer into out.
func (e *env) call(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(e.ctx, method, e.http.URL+path, rd)
	require.NoError(t, err)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out), string(raw))
	}
	return resp.StatusCode
}

// attempts records the attempts a handler saw.
type attempts struct {
	mu   sync.Mutex
	seen []seenAttempt
}

type seenAttempt struct {
	attempt    int
	at         time.Time
	checkpoint string
}

func (a *attempts) add(job *worker.Job) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, seenAttempt{attempt: job.Attempt, at: time.Now(), checkpoint: string(job.Checkpoint)})
}

func (a *attempts) list() []seenAttempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seenAttempt(nil), a.seen...)
}

func (a *attempts) numbers() []int {
	var out []int
	for _, s := range a.list() {
		out = append(out, s.attempt)
	}
	return out
}

// effects is an external system with a unique key: applying a key twice
// records it once, as an INSERT ... ON CONFLICT DO NOTHING would.
type effects struct {
	mu      sync.Mutex
	applied map[string]int
	tries   int
}

func (f *effects) apply(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applied == nil {
		f.applied = map[string]int{}
	}
	f.tries++
	if _, ok := f.applied[key]; !ok {
		f.applied[key] = f.tries
	}
}

func (f *effects) snapshot() (map[string]int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.applied))
	for k, v := range f.applied {
		out[k] = v
	}
	return out, f.tries
}
