package main_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/examples/workflow/engine/enginetest"
	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// wait bounds every wait; the tests poll, never sleep.
const wait = 60 * time.Second

const tick = 20 * time.Millisecond

const workflow = "orders"

// env is retryd's trigger path in one process (embedded NATS, a fresh
// database, the real scheduler, ingress and triggers with their APIs),
// and the example engine built as a binary, run as child processes.
type env struct {
	ctx      context.Context
	srv      *server.Server
	js       jetstream.JetStream
	pool     *pgxpool.Pool
	ingress  *httptest.Server
	triggers *httptest.Server
	binary   string
	// record is what the engine recorded on its EFFECTS stream.
	record enginetest.Record
}

func setup(t *testing.T) *env {
	t.Helper()
	be := backendtest.Start(t, 4*time.Minute)
	natstest.EnsureStreams(t, be.JS)
	e := &env{ctx: be.Ctx, srv: be.Srv, js: be.JS, pool: be.Pool, record: enginetest.Record{Ctx: be.Ctx, JS: be.JS}}
	log := servicetest.Logger(t)

	// Fast run retries: 100ms doubling, no jitter.
	_, err := e.pool.Exec(e.ctx, `UPDATE retry_policies SET base_delay_ms = 100, multiplier = 2, max_delay_ms = 2000,
		jitter = 'none', jitter_ms = 0, version = version + 1 WHERE kind = 'run' AND job_type = ''`)
	require.NoError(t, err)

	sched, err := scheduler.New(scheduler.Config{Pool: e.pool, JS: e.js, Logger: log.With().Str("service", "scheduler").Logger(),
		Registerer: prometheus.NewRegistry(), AckWait: time.Second, MaxIdle: 20 * time.Millisecond, RelayInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sched.Start(e.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, sched.Stop)

	ing, err := ingress.New(ingress.Config{Pool: e.pool, JS: e.js, Logger: log.With().Str("service", "ingress").Logger(),
		Registerer: prometheus.NewRegistry(), AckWait: time.Second, RelayInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, ing.Start(e.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, ing.Stop)
	e.ingress = httptest.NewServer(serve.Guard{}.Handler(ing.Handler()))
	t.Cleanup(e.ingress.Close)

	trg, err := triggers.New(triggers.Config{Pool: e.pool, JS: e.js, Logger: log.With().Str("service", "triggers").Logger(),
		Registerer: prometheus.NewRegistry(), AckWait: time.Second, NakDelay: 50 * time.Millisecond,
		RelayInterval: 20 * time.Millisecond, LeaseInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, trg.Start(e.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, trg.Stop)
	e.triggers = httptest.NewServer(serve.Guard{}.Handler(trg.Handler()))
	t.Cleanup(e.triggers.Close)

	e.binary = filepath.Join(t.TempDir(), "workflow")
	build := exec.CommandContext(e.ctx, "go", "build", "-o", e.binary, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return e
}

// launch creates a trigger for the workflow and posts an event that
// matches it to ingress; it returns the id of the run it launched.
func (e *env) launch(t *testing.T, source string) string {
	t.Helper()
	var trg triggers.TriggerView
	require.Equal(t, http.StatusCreated, servicetest.Do(t, e.ctx, http.MethodPost, e.triggers.URL+"/v1/triggers",
		triggers.TriggerInput{Name: "orders-" + source, Source: source, EventType: "order.created", Workflow: workflow}, &trg))
	require.Equal(t, http.StatusAccepted, servicetest.Do(t, e.ctx, http.MethodPost, e.ingress.URL+"/v1/events",
		map[string]any{"id": "evt-" + source, "source": source, "type": "order.created", "data": map[string]any{"order": 42}}, nil))
	var runID string
	require.Eventually(t, func() bool {
		err := e.pool.QueryRow(e.ctx, `SELECT run_id FROM workflow_runs WHERE trigger_id = $1`, trg.ID).Scan(&runID)
		return err == nil
	}, wait, tick, "no run launched for trigger %s", trg.ID)
	return runID
}

// run is the workflow_runs row of a run, the columns the tests check.
type run struct {
	Status, CurrentNode, LastErrorClass, Executor string
	Attempt, RetryCount                           int
}

func (e *env) run(t *testing.T, id string) run {
	t.Helper()
	var r run
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT status, current_node_id, last_error_class, executor, attempt, retry_count
		FROM workflow_runs WHERE run_id = $1`, id).Scan(&r.Status, &r.CurrentNode, &r.LastErrorClass, &r.Executor, &r.Attempt, &r.RetryCount))
	return r
}

// waitRun waits until the run leaves the statuses in flight and returns
// its row.
func (e *env) waitRun(t *testing.T, id string, statuses ...string) run {
	t.Helper()
	var r run
	require.Eventually(t, func() bool {
		r = e.run(t, id)
		for _, s := range statuses {
			if r.Status == s {
				return true
			}
		}
		return false
	}, wait, tick, "run %s: %+v", id, r)
	return r
}

// step is a workflow_run_steps row.
type step struct {
	Node, Status, RetryState, Executor, LastErrorClass string
	Attempts, RunAttempt                               int
	Output                                             json.RawMessage
}

func (e *env) steps(t *testing.T, runID string) []step {
	t.Helper()
	// reported_at (the first report's time) orders a run's nodes.
	rows, err := e.pool.Query(e.ctx, `SELECT step_id, status, retry_state, executor, last_error_class, attempts, run_attempt, output
		FROM workflow_run_steps WHERE run_id = $1 ORDER BY reported_at, step_id`, runID)
	require.NoError(t, err)
	defer rows.Close()
	var out []step
	for rows.Next() {
		var s step
		require.NoError(t, rows.Scan(&s.Node, &s.Status, &s.RetryState, &s.Executor, &s.LastErrorClass, &s.Attempts, &s.RunAttempt, &s.Output))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// stepOutputs reads the completed steps the engine reported on RUNS, by
// node.
func (e *env) stepOutputs(t *testing.T, runID string) map[string]json.RawMessage {
	t.Helper()
	out := map[string]json.RawMessage{}
	for _, m := range natstest.Messages(t, e.ctx, e.js, contract.StreamRuns, contract.RunSubject(workflow, contract.RunStep, runID)) {
		_, d, err := contract.DecodeRunStep(m.Subject(), m.Data())
		require.NoError(t, err)
		if d.Status == contract.StepCompleted {
			out[d.Node] = d.Output
		}
	}
	return out
}

// process is the engine binary running as a child process.
type process struct {
	cmd    *exec.Cmd
	out    *servicetest.Buffer
	exited chan struct{}
	err    error
}

// start runs the engine binary with args against the env's NATS; it is
// killed at cleanup if still running.
func (e *env) start(t *testing.T, executor string, args ...string) *process {
	t.Helper()
	args = append([]string{"-workflow", workflow, "-executor", executor, "-ack-wait", "2s", "-heartbeat", "300ms"}, args...)
	cmd := exec.Command(e.binary, args...)
	cmd.Env = append(os.Environ(), "NATS_URL="+e.srv.ClientURL())
	p := &process{cmd: cmd, out: &servicetest.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("engine %s output:\n%s", executor, p.out.String())
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.exited
}

// terminate sends SIGTERM and requires a clean exit within the wait.
func (p *process) terminate(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.exited:
	case <-time.After(wait):
		t.Fatalf("engine did not stop on SIGTERM:\n%s", p.out.String())
	}
	require.NoError(t, p.err, "exit status after SIGTERM:\n%s", p.out.String())
}
