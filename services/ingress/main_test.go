package ingress_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// eventually is how long tests wait for asynchronous effects.
const eventually = 20 * time.Second

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	srv  *server.Server
	js   jetstream.JetStream
	reg  *prometheus.Registry
	svc  *ingress.Service
	http *httptest.Server
}

// testConfig is the config tests run ingress with: quick redelivery, a
// relay driven by kicks, no background reconciliation.
func testConfig(t *testing.T, pool *pgxpool.Pool, js jetstream.JetStream, reg prometheus.Registerer) ingress.Config {
	return ingress.Config{
		Pool:              pool,
		JS:                js,
		Logger:            servicetest.Logger(t),
		Registerer:        reg,
		AckWait:           time.Second,
		Concurrency:       2,
		RelayInterval:     100 * time.Millisecond,
		ReconcileInterval: time.Hour,
		MaxBodyBytes:      64 << 10,
		SourceCacheTTL:    time.Millisecond,
	}
}

// setup starts embedded NATS with the streams, a fresh database and one
// started ingress instance serving HTTP. opts adjust the config.
func setup(t *testing.T, opts ...func(*ingress.Config)) *bundle {
	t.Helper()
	be := backendtest.Start(t, 2*time.Minute)
	b := &bundle{ctx: be.Ctx, pool: be.Pool, srv: be.Srv, js: be.JS, reg: prometheus.NewRegistry()}
	natstest.EnsureStreams(t, b.js)
	cfg := testConfig(t, b.pool, b.js, b.reg)
	for _, o := range opts {
		o(&cfg)
	}
	b.svc = b.start(t, cfg)
	b.http = httptest.NewServer(serve.Guard{}.Handler(b.svc.Handler()))
	t.Cleanup(b.http.Close)
	return b
}

// start builds and starts an ingress instance, stopped in t.Cleanup.
func (b *bundle) start(t *testing.T, cfg ingress.Config) *ingress.Service {
	t.Helper()
	svc, err := ingress.New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Start(b.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, svc.Stop)
	return svc
}

// do sends a JSON request and decodes the JSON answer into out (when not
// nil); it returns the status.
func (b *bundle) do(t *testing.T, method, path string, body any, out any, headers ...string) int {
	t.Helper()
	return servicetest.Do(t, b.ctx, method, b.http.URL+path, body, out, headers...)
}

// apiError is the body of an error answer.
type apiError = serve.ErrorBody

// postAll posts an event of source and type typ for each of ids.
func (b *bundle) postAll(t *testing.T, source, typ string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		b.post(t, event(id, source, typ))
	}
}

// waitCount waits until query counts want.
func (b *bundle) waitCount(t *testing.T, want int, query string, args ...any) {
	t.Helper()
	require.Eventually(t, func() bool { return b.count(t, query, args...) == want }, eventually, 20*time.Millisecond,
		"%s: want %d", query, want)
}

// throttled limits source to one event an hour, posts admitted (of type
// typ), which takes the hour's slot, then each of deferred, which the
// gate defers; it returns when each is in its state.
func (b *bundle) throttled(t *testing.T, source, typ, admitted string, deferred ...string) {
	t.Helper()
	servicetest.ClearOfWindowEdge(t, time.Hour, time.Minute)
	b.putSource(t, source, map[string]any{"rate_limit": 1, "rate_window": "1h"})
	b.post(t, event(admitted, source, typ))
	b.waitStatus(t, "admitted", admitted)
	b.postAll(t, source, typ, deferred...)
	b.waitStatus(t, "deferred", deferred...)
}

// post sends one event and requires a 202.
func (b *bundle) post(t *testing.T, ev map[string]any) ingress.Accepted {
	t.Helper()
	var acc ingress.Accepted
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/events", ev, &acc))
	return acc
}

func event(id, source, typ string) map[string]any {
	ev := map[string]any{"source": source, "type": typ, "data": map[string]any{"n": 1}}
	if id != "" {
		ev["id"] = id
	}
	return ev
}

// status reads an event's status, "" when it is not stored.
func (b *bundle) status(t *testing.T, id string) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(b.ctx, `SELECT status FROM workflow_events WHERE event_id = $1`, id).Scan(&s)
	if err != nil {
		return ""
	}
	return s
}

func (b *bundle) waitStatus(t *testing.T, status string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.Eventually(t, func() bool { return b.status(t, id) == status }, eventually, 20*time.Millisecond,
			"event %s should become %s, is %q", id, status, b.status(t, id))
	}
}

func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	return pgtest.Count(t, b.pool, query, args...)
}

// streamMsgs returns the messages of stream whose subject starts with
// prefix, in order.
func streamMsgs(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, prefix string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	if info.State.Msgs == 0 {
		return nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		if strings.HasPrefix(m.Subject, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// admissionOrder is the ids of source's events on EVENTS, in the order
// they were admitted.
func (b *bundle) admissionOrder(t *testing.T, source string) []string {
	t.Helper()
	var order []string
	for _, m := range streamMsgs(t, b.ctx, b.js, contract.StreamEvents, "events."+source+".") {
		order = append(order, m.Header.Get(nats.MsgIdHdr))
	}
	return order
}

// admittedIDs counts each event id's messages on EVENTS.
func (b *bundle) admittedIDs(t *testing.T) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, m := range streamMsgs(t, b.ctx, b.js, contract.StreamEvents, "events.") {
		ids[m.Header.Get(nats.MsgIdHdr)]++
	}
	return ids
}

// lifecycle returns the RETRIES messages of one event, by lifecycle event.
func (b *bundle) lifecycle(t *testing.T, id string) map[contract.Lifecycle][]contract.LifecycleEvent {
	t.Helper()
	out := map[contract.Lifecycle][]contract.LifecycleEvent{}
	for _, m := range streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.") {
		if !strings.HasSuffix(m.Subject, "."+id) {
			continue
		}
		lc, err := contract.DecodeLifecycle(m.Subject, m.Data)
		require.NoError(t, err)
		out[lc.Event] = append(out[lc.Event], lc)
	}
	return out
}

// publishDue publishes what the scheduler would when attempt of id is
// due.
func (b *bundle) publishDue(t *testing.T, id, source string, attempt int) {
	t.Helper()
	b.publishDueAt(t, id, source, attempt, time.Now())
}

// publishDueAt publishes the scheduler's due for attempt, scheduled for next.
func (b *bundle) publishDueAt(t *testing.T, id, source string, attempt int, next time.Time) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test/scheduler", contract.Due, contract.DueData{
		Kind: contract.KindEvent, ID: id, Attempt: attempt, NextAttemptAt: next, Source: source,
	}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

// publishScheduled publishes the scheduler's confirmation of attempt.
func (b *bundle) publishScheduled(t *testing.T, ev contract.Lifecycle, id, source string, attempt int, next time.Time) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test/scheduler", ev, contract.ScheduledData{
		Kind: contract.KindEvent, ID: id, Attempt: attempt, NextAttemptAt: next, Source: source,
		Decision: contract.Decision{Policy: "event-ingress", PolicyVersion: 1, DecidedBy: contract.DecidedByThrottle},
	}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

// putSource configures a source through the API.
func (b *bundle) putSource(t *testing.T, source string, body map[string]any) ingress.SourceView {
	t.Helper()
	var v ingress.SourceView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/sources/"+source, body, &v))
	return v
}

// counter reads a counter of the bundle's registry by name and labels.
func (b *bundle) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	var pairs []string
	for k, v := range labels {
		pairs = append(pairs, k, v)
	}
	return servicetest.Metric(t, b.reg, name, pairs...)
}

// drained waits until a consumer of ingress has handled every message.
func (b *bundle) drained(t *testing.T, consumer string) {
	t.Helper()
	stream := contract.StreamRetries
	if consumer == ingress.ConsumerGate {
		stream = contract.StreamIngest
	}
	cons, err := b.js.Consumer(b.ctx, stream, consumer)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(b.ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, eventually, 20*time.Millisecond)
}
