package triggers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// eventually bounds how long tests wait for asynchronous effects.
const eventually = 30 * time.Second

const tick = 10 * time.Millisecond

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	srv  *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	svc  *Service
	reg  *prometheus.Registry
	http *httptest.Server
}

// testConfig runs the service with quick redeliveries and relay, and no
// background reconciliation (tests call Reconcile).
func (b *bundle) testConfig(t *testing.T) Config {
	return Config{
		Pool: b.pool, JS: b.js, Logger: servicetest.Logger(t), Registerer: prometheus.NewRegistry(),
		Concurrency: 4, AckWait: time.Second, NakDelay: 50 * time.Millisecond,
		RelayInterval: 20 * time.Millisecond, ReconcileInterval: -1, LeaseInterval: -1, InboxRetention: -1,
	}
}

// setup starts embedded NATS with the streams and a fresh database. With
// start, it also starts one service instance and serves its API.
func setup(t *testing.T, start bool, opts ...func(*Config)) *bundle {
	t.Helper()
	be := backendtest.Start(t, 3*time.Minute)
	b := &bundle{ctx: be.Ctx, pool: be.Pool, srv: be.Srv, nc: be.NC, js: be.JS}
	natstest.EnsureStreams(t, b.js)
	cfg := b.testConfig(t)
	for _, o := range opts {
		o(&cfg)
	}
	if start {
		b.svc = b.start(t, cfg)
	} else {
		svc, err := New(cfg)
		require.NoError(t, err)
		b.svc = svc
	}
	b.reg = cfg.Registerer.(*prometheus.Registry)
	b.http = httptest.NewServer(serve.Guard{}.Handler(b.svc.Handler()))
	t.Cleanup(b.http.Close)
	return b
}

// start builds and starts an instance, stopped in t.Cleanup.
func (b *bundle) start(t *testing.T, cfg Config) *Service {
	t.Helper()
	svc, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Start(b.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, svc.Stop)
	return svc
}

// do sends a request and decodes the JSON answer into out (when not nil).
func (b *bundle) do(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	return servicetest.Do(t, b.ctx, method, b.http.URL+path, body, out)
}

// apiError is the body of an error answer.
type apiError = serve.ErrorBody

func (b *bundle) createTrigger(t *testing.T, in TriggerInput) TriggerView {
	t.Helper()
	var v TriggerView
	var e apiError
	status := b.do(t, http.MethodPost, "/v1/triggers", in, &v)
	if status != http.StatusCreated {
		b.do(t, http.MethodPost, "/v1/triggers", in, &e)
		t.Fatalf("create trigger: status %d: %+v", status, e)
	}
	return v
}

// publishEvent publishes an admitted event on events.<source>.<type>.
func (b *bundle) publishEvent(t *testing.T, source, typ, id string, data any) contract.Envelope {
	t.Helper()
	raw, err := json.Marshal(data)
	require.NoError(t, err)
	env := contract.Envelope{SpecVersion: contract.SpecVersion, ID: id, Source: source, Type: typ, Time: time.Now().UTC(), Data: raw}
	msg, err := contract.NewEventMsg(contract.EventSubject(source, typ), env)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	return env
}

// republish publishes msg again under a fresh Nats-Msg-Id, so JetStream
// stores it twice: a redelivery the deduplication window cannot catch.
func (b *bundle) republish(t *testing.T, msg *nats.Msg) {
	t.Helper()
	again := nats.NewMsg(msg.Subject)
	again.Data = msg.Data
	for k, v := range msg.Header {
		again.Header[k] = v
	}
	again.Header.Set(contract.HeaderMsgID, msg.Header.Get(contract.HeaderMsgID)+"-again-"+contract.NewID())
	_, err := b.js.PublishMsg(b.ctx, again)
	require.NoError(t, err)
}

// streamMsgs reads every message of stream matching filter.
func (b *bundle) streamMsgs(t *testing.T, stream, filter string) []jetstream.Msg {
	t.Helper()
	return natstest.Messages(t, b.ctx, b.js, stream, filter)
}

// requestedRuns counts the run requests in RUNS per run id.
func (b *bundle) requestedRuns(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range b.streamMsgs(t, contract.StreamRuns, "runs.*.requested.*") {
		_, d, err := contract.DecodeRunRequested(m.Subject(), m.Data())
		require.NoError(t, err)
		out[d.RunID]++
	}
	return out
}

// lifecycle returns the event-trigger lifecycle events of one kind of
// event in RETRIES, in order.
func (b *bundle) lifecycle(t *testing.T, ev contract.Lifecycle) []contract.LifecycleEvent {
	t.Helper()
	return b.lifecycleOf(t, contract.KindEventTrigger, ev)
}

// lifecycleOf is lifecycle for any kind (runs are kind run).
func (b *bundle) lifecycleOf(t *testing.T, kind string, ev contract.Lifecycle) []contract.LifecycleEvent {
	t.Helper()
	var out []contract.LifecycleEvent
	for _, m := range b.streamMsgs(t, contract.StreamRetries, contract.RetryFilter(kind, ev)) {
		le, err := contract.DecodeLifecycle(m.Subject(), m.Data())
		require.NoError(t, err)
		out = append(out, le)
	}
	return out
}

func (b *bundle) delivery(t *testing.T, id string) triggerstore.Delivery {
	t.Helper()
	d, err := triggerstore.GetDelivery(b.ctx, b.pool, id)
	require.NoError(t, err)
	return d
}

// waitDelivery waits until the delivery exists and cond holds.
func (b *bundle) waitDelivery(t *testing.T, id string, cond func(triggerstore.Delivery) bool) triggerstore.Delivery {
	t.Helper()
	var d triggerstore.Delivery
	require.Eventually(t, func() bool {
		var err error
		d, err = triggerstore.GetDelivery(b.ctx, b.pool, id)
		return err == nil && cond(d)
	}, eventually, tick, "delivery %s: last seen %+v", id, d)
	return d
}

func (b *bundle) countDeliveries(t *testing.T, triggerID string) map[triggerstore.Status]int {
	t.Helper()
	c, err := triggerstore.CountByStatus(b.ctx, b.pool, triggerID)
	require.NoError(t, err)
	return c
}

// outboxEmpty reports whether every outbox row was published.
func (b *bundle) outboxEmpty(t *testing.T) bool {
	t.Helper()
	return pgtest.Count(t, b.pool, `SELECT count(*) FROM outbox`) == 0
}

// slowDeliveryBackoff makes a held delivery's backoff a minute: in a
// test's time only a freed slot launches it, not its retry.
func (b *bundle) slowDeliveryBackoff(t *testing.T) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE retry_policies SET base_delay_ms = 60000, max_delay_ms = 60000
		WHERE kind = 'event-trigger' AND job_type = ''`)
	require.NoError(t, err)
}

// noRunRetries makes the scheduler give up on a failed run at once.
func (b *bundle) noRunRetries(t *testing.T) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE retry_policies SET max_retries = 0 WHERE kind = 'run' AND job_type = ''`)
	require.NoError(t, err)
}

// loseRetries deletes the RETRIES stream, creates it again empty and
// reconciles until the service has republished the one unconfirmed
// message the stream lost; no pass republishes more.
func (b *bundle) loseRetries(t *testing.T) {
	t.Helper()
	require.NoError(t, b.js.DeleteStream(b.ctx, contract.StreamRetries))
	natstest.EnsureStreams(t, b.js)
	require.Eventually(t, func() bool {
		n, err := b.svc.Reconcile(b.ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, n, 1, "only the unconfirmed message is republished")
		return n == 1
	}, eventually, 100*time.Millisecond)
}

// inFlight counts the trigger's runs that hold one of its concurrency
// slots.
func (b *bundle) inFlight(t *testing.T, triggerID string) int {
	t.Helper()
	n, err := triggerstore.CountInFlight(b.ctx, b.pool, triggerID)
	require.NoError(t, err)
	return n
}

// waitSlotsFree waits until no run of the trigger holds a slot.
func (b *bundle) waitSlotsFree(t *testing.T, triggerID string) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, err := triggerstore.CountInFlight(b.ctx, b.pool, triggerID)
		return err == nil && n == 0
	}, eventually, tick)
}

func counter(t *testing.T, c *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	return testutil.ToFloat64(c.WithLabelValues(labels...))
}

// publishDue publishes the due event the scheduler would for attempt of a
// delivery, carrying payload.
func (b *bundle) publishDue(t *testing.T, deliveryID string, attempt int, payload json.RawMessage) *nats.Msg {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test/scheduler", contract.Due, contract.DueData{
		Kind: contract.KindEventTrigger, ID: deliveryID, Attempt: attempt, NextAttemptAt: time.Now().UTC(), Payload: payload,
	}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	return msg
}

func (b *bundle) publishRunFinished(t *testing.T, workflow, runID, event string) *nats.Msg {
	t.Helper()
	msg, err := contract.NewRunMsg("test/executor", event, contract.RunFinishedData{RunID: runID, Workflow: workflow}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	return msg
}

// executor is the in-process stand-in for a workflow executor: it takes
// run requests from RUNS (once per run id, as a real executor would), holds
// each run for hold, then publishes its completion. It tracks how many
// runs it has in flight and the most it ever had.
type executor struct {
	mu        sync.Mutex
	seen      map[string]bool
	inFlight  int
	maxFlight int
	completed int
	cc        jetstream.ConsumeContext
	stopped   atomic.Bool
}

func (b *bundle) startExecutor(t *testing.T, hold time.Duration) *executor {
	t.Helper()
	ex := &executor{seen: map[string]bool{}}
	cons, err := b.js.CreateOrUpdateConsumer(b.ctx, contract.StreamRuns, jetstream.ConsumerConfig{
		Durable: "test-executor", FilterSubjects: []string{"runs.*.requested.*"},
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second,
	})
	require.NoError(t, err)
	ex.cc, err = cons.Consume(func(m jetstream.Msg) {
		_, d, err := contract.DecodeRunRequested(m.Subject(), m.Data())
		if err != nil {
			_ = m.Term()
			return
		}
		ex.mu.Lock()
		if ex.seen[d.RunID] {
			ex.mu.Unlock()
			_ = m.Ack()
			return
		}
		ex.seen[d.RunID] = true
		ex.inFlight++
		ex.maxFlight = max(ex.maxFlight, ex.inFlight)
		ex.mu.Unlock()
		_ = m.Ack()
		time.AfterFunc(hold, func() {
			ex.mu.Lock()
			ex.inFlight--
			ex.completed++
			ex.mu.Unlock()
			msg, err := contract.NewRunMsg("test/executor", contract.RunCompleted, contract.RunFinishedData{RunID: d.RunID, Workflow: d.Workflow}, time.Now())
			if err == nil {
				_, err = b.js.PublishMsg(context.Background(), msg)
			}
			if err != nil && !ex.stopped.Load() {
				t.Errorf("executor: publish completion of %s: %v", d.RunID, err)
			}
		})
	})
	require.NoError(t, err)
	t.Cleanup(func() { ex.stopped.Store(true); ex.cc.Stop() })
	return ex
}

func (ex *executor) stats() (seen, maxFlight, completed int) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return len(ex.seen), ex.maxFlight, ex.completed
}
