package scheduler_test

import (
	"context"
	"strconv"
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
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// waitFor bounds every wait of these tests; they poll, never sleep.
const waitFor = 30 * time.Second

// hourMS is an hour in the milliseconds of a policy's delays: a delay
// longer than any test waits.
const hourMS = int64(time.Hour / time.Millisecond)

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	srv  *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
}

func setup(t *testing.T) *bundle {
	t.Helper()
	be := backendtest.Start(t, 3*time.Minute)
	return &bundle{ctx: be.Ctx, pool: be.Pool, srv: be.Srv, nc: be.NC, js: be.JS}
}

// instance is a started scheduler and its metrics registry.
type instance struct {
	*scheduler.Scheduler
	reg *prometheus.Registry
}

// start starts a scheduler on the bundle's database and server; it is
// stopped in t.Cleanup.
func (b *bundle) start(t *testing.T, mods ...func(*scheduler.Config)) instance {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := scheduler.Config{
		Pool: b.pool, JS: b.js, Logger: servicetest.Logger(t), Registerer: reg,
		MaxIdle: 200 * time.Millisecond, AckWait: 2 * time.Second, MetricsInterval: 100 * time.Millisecond,
		Streams: streams.Options{Storage: jetstream.MemoryStorage},
	}
	for _, m := range mods {
		m(&cfg)
	}
	s, err := scheduler.New(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, s.Stop(ctx))
	})
	return instance{Scheduler: s, reg: reg}
}

// stop stops an instance now, as a graceful shutdown does, within 20 s
// (the stop at cleanup then finds it stopped).
func (b *bundle) stop(t *testing.T, s instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, s.Stop(ctx))
}

// policy stores a policy with millisecond figures and no jitter unless mod
// changes them.
func (b *bundle) policy(t *testing.T, kind, jobType string, maxRetries int, baseMS, maxMS int64, mod ...func(*policy.Policy)) policy.Policy {
	t.Helper()
	p := policy.Policy{
		Kind: kind, JobType: jobType, Name: kind + "-policy", MaxRetries: maxRetries, Enabled: true,
		Backoff:             backoff.Config{Base: policy.FromMS(baseMS), Multiplier: 2, Max: policy.FromMS(maxMS), Jitter: backoff.JitterNone},
		NonRetryableClasses: []errclass.Class{errclass.Authentication, errclass.Permission, errclass.Validation},
	}
	for _, m := range mod {
		m(&p)
	}
	saved, err := retrystore.PutPolicy(b.ctx, b.pool, p, "test")
	require.NoError(t, err)
	return saved
}

// publish publishes a lifecycle event as an owner would.
func (b *bundle) publish(t *testing.T, ev contract.Lifecycle, data any) *jetstream.PubAck {
	t.Helper()
	msg := lifecycleMsg(t, ev, data)
	ack, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	return ack
}

func lifecycleMsg(t *testing.T, ev contract.Lifecycle, data any) *nats.Msg {
	t.Helper()
	return contracttest.LifecycleMsg(t, "test/owner", ev, data, time.Now())
}

func failed(kind, id string, attempt int, class string) contract.FailedData {
	return contract.FailedData{Kind: kind, ID: id, Attempt: attempt, Error: contract.ErrorInfo{Class: class, Message: "boom"}}
}

// waitRow polls the retry row until cond holds.
func (b *bundle) waitRow(t *testing.T, kind, id string, cond func(r retrystore.Retry) bool) retrystore.Retry {
	t.Helper()
	var got retrystore.Retry
	require.Eventually(t, func() bool {
		r, err := retrystore.Get(b.ctx, b.pool, kind, id)
		if err != nil {
			return false
		}
		got = r
		return cond(r)
	}, waitFor, 10*time.Millisecond, "row %s/%s", kind, id)
	return got
}

// failTo publishes the failure of attempt of kind/id and waits for its
// row to be in state with the next attempt.
func (b *bundle) failTo(t *testing.T, kind, id string, attempt int, class string, state retrystore.State) retrystore.Retry {
	t.Helper()
	b.publish(t, contract.Failed, failed(kind, id, attempt, class))
	return b.waitRow(t, kind, id, inState(state, attempt+1))
}

func inState(state retrystore.State, attempt int) func(retrystore.Retry) bool {
	return func(r retrystore.Retry) bool { return r.State == state && r.Attempt == attempt }
}

func (b *bundle) history(t *testing.T, kind, id string) []retrystore.HistoryEntry {
	t.Helper()
	h, err := retrystore.History(b.ctx, b.pool, kind, id)
	require.NoError(t, err)
	return h
}

func events(h []retrystore.HistoryEntry) []string {
	out := make([]string, len(h))
	for i, e := range h {
		out[i] = e.Event + ":" + strconv.Itoa(e.Attempt)
	}
	return out
}

// streamMsgs reads every message of RETRIES matching filter.
func (b *bundle) streamMsgs(t *testing.T, filter string) []jetstream.Msg {
	t.Helper()
	return natstest.Messages(t, b.ctx, b.js, contract.StreamRetries, filter)
}

// metric sums the series of a metric whose labels include the given
// name/value pairs.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return servicetest.Metric(t, reg, name, labels...)
}

// waitMetric waits until the metric (summed as metric sums it) is want.
func waitMetric(t *testing.T, reg prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	waitMetricSum(t, []prometheus.Gatherer{reg}, want, name, labels...)
}

// waitMetricSum waits until the metric summed over regs (instances
// sharing the work) is want. A scheduler counts what it did after the
// commit that a test waits for, so a metric read at once can lag it.
func waitMetricSum(t *testing.T, regs []prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	sum := func() float64 {
		var n float64
		for _, reg := range regs {
			n += metric(t, reg, name, labels...)
		}
		return n
	}
	require.Eventually(t, func() bool { return sum() == want }, waitFor, 10*time.Millisecond,
		"%s%v never reached %v", name, labels, want)
}

// msgIDs counts stored messages per Nats-Msg-Id.
func msgIDs(msgs []jetstream.Msg) map[string]int {
	out := map[string]int{}
	for _, m := range msgs {
		out[m.Headers().Get(contract.HeaderMsgID)]++
	}
	return out
}

// requireEachOnce checks that msgs hold n distinct Nats-Msg-Ids, each
// stored once: n messages, none emitted twice.
func requireEachOnce(t *testing.T, msgs []jetstream.Msg, n int) {
	t.Helper()
	ids := msgIDs(msgs)
	require.Len(t, ids, n)
	for id, count := range ids {
		require.Equal(t, 1, count, id)
	}
}

// waitRetries polls the store until it lists n retries matching f.
func (b *bundle) waitRetries(t *testing.T, f retrystore.ListFilter, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		page, err := retrystore.List(b.ctx, b.pool, f)
		require.NoError(t, err)
		return len(page.Retries) == n
	}, waitFor, 10*time.Millisecond, "%d retries of %+v", n, f)
}

func decodeDue(t *testing.T, m jetstream.Msg) contract.DueData {
	t.Helper()
	ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
	require.NoError(t, err)
	require.NotNil(t, ev.Due)
	return *ev.Due
}

// waitQuiet waits until the consumer has nothing pending and the outbox is
// empty.
func (b *bundle) waitQuiet(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		settled := natstest.Settled(t, b.ctx, b.js, contract.StreamRetries, scheduler.ConsumerName)
		return settled && pgtest.Count(t, b.pool, `SELECT count(*) FROM outbox`) == 0
	}, waitFor, 20*time.Millisecond)
}

// shrinkDuplicateWindow sets the RETRIES duplicate window to d, so a
// re-emission with the same Nats-Msg-Id is stored past it. It must run
// before anything is stored: the server arms its expiry timer with the
// window of the first message, and a window cut later may keep its ids
// for the old one (storeAgain flaked that way).
func shrinkDuplicateWindow(t *testing.T, b *bundle, d time.Duration) {
	t.Helper()
	stream, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	info, err := stream.Info(b.ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs)
	cfg := info.Config
	cfg.Duplicates = d
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
}

// storeAgain stores msg on RETRIES once more, as JetStream does for a
// fact republished past its duplicate window (same headers, same body):
// msg is republished until it is stored anew. The test shrinks the window
// (shrinkDuplicateWindow) before anything is stored.
func (b *bundle) storeAgain(t *testing.T, msg *nats.Msg) *jetstream.PubAck {
	t.Helper()
	st, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.LessOrEqual(t, st.CachedInfo().Config.Duplicates, time.Second, "shrink the duplicate window before anything is stored")
	var ack *jetstream.PubAck
	require.Eventually(t, func() bool {
		ack, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
		return !ack.Duplicate
	}, waitFor, 20*time.Millisecond, "stored again past the duplicate window")
	return ack
}

// storeTwice stores msg on RETRIES twice, as a fact published again past
// the duplicate window: it publishes msg, checks that JetStream drops the
// same message published again inside the window, and stores it again
// (storeAgain). It returns the acks of the two copies stored.
func (b *bundle) storeTwice(t *testing.T, msg *nats.Msg) (first, again *jetstream.PubAck) {
	t.Helper()
	first, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	dropped, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	require.True(t, dropped.Duplicate, "inside the window JetStream drops it")
	return first, b.storeAgain(t, msg)
}

// withEnvelopeID is msg with its envelope id and Nats-Msg-Id set to id: a
// fact as an owner that names its own ids publishes it.
func withEnvelopeID(t *testing.T, msg *nats.Msg, id string) *nats.Msg {
	t.Helper()
	env, err := contract.DecodeEnvelope(msg.Data)
	require.NoError(t, err)
	env.ID = id
	body, err := env.Marshal()
	require.NoError(t, err)
	out := nats.NewMsg(msg.Subject)
	out.Data = body
	for k, v := range msg.Header {
		out.Header[k] = append([]string(nil), v...)
	}
	out.Header.Set(contract.HeaderMsgID, id)
	return out
}

// failAt is a Config.Failpoint that runs fn at point and lets every other
// point pass.
func failAt(point string, fn func(ctx context.Context) error) func(context.Context, string) error {
	return func(ctx context.Context, p string) error {
		if p != point {
			return nil
		}
		return fn(ctx)
	}
}
