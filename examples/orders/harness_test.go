package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// wait bounds every wait; the tests poll, never sleep.
const wait = 60 * time.Second

const tick = 20 * time.Millisecond

// baseDelay is the order policy's first backoff step; it doubles per
// retry, without jitter, so the decisions' delays are exact.
const baseDelay = 200 * time.Millisecond

// env is retryd's scheduler over embedded NATS and a fresh database, with
// the example run next to it, in this process or as a child process.
type env struct {
	ctx  context.Context
	srv  *server.Server
	js   jetstream.JetStream
	pool *pgxpool.Pool
}

// setup starts the backends with the retryd streams and stores the order
// kind's policy. A duplicates above 0 becomes RETRIES' duplicate window,
// shrunk before anything is stored so that a republish past it takes a
// second, not three minutes.
func setup(t *testing.T, duplicates time.Duration) *env {
	t.Helper()
	be := backendtest.Start(t, 4*time.Minute)
	natstest.EnsureStreams(t, be.JS)
	e := &env{ctx: be.Ctx, srv: be.Srv, js: be.JS, pool: be.Pool}
	if duplicates > 0 {
		retries, err := e.js.Stream(e.ctx, contract.StreamRetries)
		require.NoError(t, err)
		cfg := retries.CachedInfo().Config
		cfg.Duplicates = duplicates
		_, err = e.js.UpdateStream(e.ctx, cfg)
		require.NoError(t, err)
	}
	_, err := retrystore.PutPolicy(e.ctx, e.pool, policy.Policy{
		Kind: Kind, Name: "orders", MaxRetries: 5, Enabled: true,
		Backoff:             backoff.Config{Base: baseDelay, Multiplier: 2, Max: 10 * baseDelay, Jitter: backoff.JitterNone},
		NonRetryableClasses: []errclass.Class{errclass.Validation},
	}, "test")
	require.NoError(t, err)
	return e
}

// scheduler starts retryd's scheduler; it is stopped at cleanup.
func (e *env) scheduler(t *testing.T) {
	t.Helper()
	s, err := scheduler.New(scheduler.Config{Pool: e.pool, JS: e.js, Logger: servicetest.Logger(t), Registerer: prometheus.NewRegistry(),
		AckWait: time.Second, MaxIdle: 20 * time.Millisecond, RelayInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, s.Start(e.ctx))
	servicetest.StopOnCleanup(t, 20*time.Second, s.Stop)
}

// orders runs the example's run in this process until the test ends,
// and requires that it stops cleanly then.
func (e *env) orders(t *testing.T, cfg config) {
	t.Helper()
	cfg.natsURL = e.srv.ClientURL()
	if cfg.ackWait == 0 {
		cfg.ackWait = 30 * time.Second
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("RETRYD_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- run(ctx, log, cfg, 0) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "orders stops cleanly")
	})
	// Started once its consumer of due retries exists.
	require.Eventually(t, func() bool {
		_, err := e.js.Consumer(e.ctx, contract.StreamRetries, "owner-"+Kind)
		return err == nil
	}, wait, tick, "orders never started")
}

// place publishes an order as the shop does.
func (e *env) place(t *testing.T, o Order) {
	t.Helper()
	require.NoError(t, placeOrder(e.ctx, e.js, o))
}

// fact is one lifecycle event of an order on RETRIES.
type fact struct {
	contract.LifecycleEvent
	stored time.Time
}

func (f fact) String() string { return string(f.Event) + ":" + strconv.Itoa(f.Attempt()) }

// facts reads every fact of order id on RETRIES, in stream order.
func (e *env) facts(t *testing.T, id string) []fact {
	t.Helper()
	var out []fact
	for _, m := range natstest.Messages(t, e.ctx, e.js, contract.StreamRetries, contract.RetryItemFilter(Kind, id)) {
		ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
		require.NoError(t, err)
		meta, err := m.Metadata()
		require.NoError(t, err)
		out = append(out, fact{LifecycleEvent: ev, stored: meta.Timestamp})
	}
	return out
}

// waitFact waits for the fact ev of attempt of order id and returns it.
// It polls the last message on the fact's subject, which creates no
// consumer, and reads the order's facts once it is there.
func (e *env) waitFact(t *testing.T, id string, ev contract.Lifecycle, attempt int) fact {
	t.Helper()
	require.Eventually(t, func() bool {
		m, ok := e.last(t, contract.StreamRetries, contract.RetrySubject(Kind, ev, id))
		if !ok {
			return false
		}
		a, err := strconv.Atoi(m.Header.Get(contract.HeaderAttempt))
		return err == nil && a >= attempt
	}, wait, tick, "no %s fact of attempt %d of order %s", ev, attempt, id)
	all := e.facts(t, id)
	for _, f := range all {
		if f.Event == ev && f.Attempt() == attempt {
			return f
		}
	}
	t.Fatalf("no %s fact of attempt %d of order %s; it has %v", ev, attempt, id, all)
	return fact{}
}

// last reads the last message on subject, if the stream exists and has
// one.
func (e *env) last(t *testing.T, stream, subject string) (*jetstream.RawStreamMsg, bool) {
	t.Helper()
	st, err := e.js.Stream(e.ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false
	}
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(e.ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, false
	}
	require.NoError(t, err)
	return m, true
}

// only returns the facts of one event.
func only(facts []fact, ev contract.Lifecycle) []fact {
	var out []fact
	for _, f := range facts {
		if f.Event == ev {
			out = append(out, f)
		}
	}
	return out
}

// history waits until the scheduler's retry history of order id has n
// entries and returns it.
func (e *env) history(t *testing.T, id string, n int) []retrystore.HistoryEntry {
	t.Helper()
	var h []retrystore.HistoryEntry
	require.Eventually(t, func() bool {
		var err error
		h, err = retrystore.History(e.ctx, e.pool, Kind, id)
		require.NoError(t, err)
		return len(h) >= n
	}, wait, tick, "history of order %s", id)
	return h
}

// events names each entry of a history by its event and attempt.
func events(h []retrystore.HistoryEntry) []string {
	out := make([]string, len(h))
	for i, x := range h {
		out[i] = x.Event + ":" + strconv.Itoa(x.Attempt)
	}
	return out
}

// shipments reads the shipments recorded for order id: its effects.
func (e *env) shipments(t *testing.T, id string) []Shipment {
	t.Helper()
	var out []Shipment
	for _, m := range natstest.Messages(t, e.ctx, e.js, ShipmentsStream, ShipmentSubject(id)) {
		var s Shipment
		require.NoError(t, json.Unmarshal(m.Data(), &s))
		out = append(out, s)
	}
	return out
}

// build builds the example into a temporary directory.
func build(t *testing.T, ctx context.Context) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "orders")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// start runs the example's binary with args against the env's NATS, in
// a process group of its own; it is killed at cleanup if still running,
// and its log shown if the test failed.
func (e *env) start(t *testing.T, bin, name string, args ...string) *harness.Process {
	t.Helper()
	p := &harness.Process{Name: name, Bin: bin, Args: args, Env: []string{"NATS_URL=" + e.srv.ClientURL()},
		LogPath: filepath.Join(t.TempDir(), name+".log")}
	require.NoError(t, p.Start())
	t.Cleanup(func() {
		_ = p.Kill9()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, harness.Tail(p.LogPath, 8000))
		}
	})
	return p
}
