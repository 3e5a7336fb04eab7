package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	testStream = "OUTBOXTEST"
	owner      = "svc"
)

type bundle struct {
	pool *pgxpool.Pool
	srv  *server.Server
	js   jetstream.JetStream
}

func setup(t *testing.T, opts ...natstest.Option) *bundle {
	t.Helper()
	b := &bundle{pool: pgtest.NewPool(t), srv: natstest.RunServer(t, opts...)}
	_, b.js = natstest.Connect(t, b.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       testStream,
		Subjects:   []string{"obt.>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	require.NoError(t, err)
	return b
}

func (b *bundle) relay(t *testing.T, mutate func(*RelayConfig)) *Relay {
	t.Helper()
	cfg := RelayConfig{
		Pool:       b.pool,
		JS:         b.js,
		Owner:      owner,
		Logger:     zerolog.Nop(),
		Registerer: prometheus.NewRegistry(),
		AckTimeout: 2 * time.Second,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := NewRelay(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })
	return r
}

func testMsg(i int) *nats.Msg {
	m := nats.NewMsg("obt.item." + strconv.Itoa(i))
	m.Header.Set(contract.HeaderMsgID, "m-"+strconv.Itoa(i))
	m.Header.Set(contract.HeaderContentType, contract.ContentTypeJSON)
	m.Header.Add("X-Multi", "a")
	m.Header.Add("X-Multi", "b")
	m.Data = []byte(`{"i":` + strconv.Itoa(i) + `}`)
	return m
}

func (b *bundle) insert(t *testing.T, owner string, from, to int) {
	t.Helper()
	ctx := context.Background()
	var msgs []*nats.Msg
	for i := from; i < to; i++ {
		msgs = append(msgs, testMsg(i))
	}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return Insert(ctx, tx, owner, msgs...)
	}))
}

func (b *bundle) pending(t *testing.T) int {
	t.Helper()
	return pgtest.Count(t, b.pool, "SELECT count(*) FROM outbox")
}

// streamMsgs reads every message of the test stream in sequence order.
func (b *bundle) streamMsgs(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, testStream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// requireStreamHas checks the stream holds messages from..to-1 exactly once
// each, in that order, with their headers and bodies.
func (b *bundle) requireStreamHas(t *testing.T, from, to int) {
	t.Helper()
	msgs := b.streamMsgs(t)
	require.Len(t, msgs, to-from)
	for k, m := range msgs {
		want := testMsg(from + k)
		require.Equal(t, want.Subject, m.Subject)
		require.Equal(t, want.Header.Get(contract.HeaderMsgID), m.Header.Get(contract.HeaderMsgID))
		require.Equal(t, want.Header.Get(contract.HeaderContentType), m.Header.Get(contract.HeaderContentType))
		require.Equal(t, []string{"a", "b"}, m.Header.Values("X-Multi"))
		require.Equal(t, want.Data, m.Data)
	}
}

func TestInsertStoresMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, owner, 0, 3)
	rows, err := b.pool.Query(context.Background(),
		"SELECT owner, subject, msg_id, headers, payload, attempts, last_error FROM outbox ORDER BY id")
	require.NoError(t, err)
	type stored struct {
		Owner, Subject, MsgID string
		Headers               nats.Header
		Payload               []byte
		Attempts              int
		LastError             string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stored])
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i, s := range got {
		want := testMsg(i)
		require.Equal(t, stored{owner, want.Subject, "m-" + strconv.Itoa(i), want.Header, want.Data, 0, ""}, s)
	}
}

func TestInsertRejectsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	noID := nats.NewMsg("obt.x")
	wildcard := testMsg(1)
	wildcard.Subject = "obt.*"
	withReply := testMsg(2)
	withReply.Reply = "_INBOX.x"
	for name, tc := range map[string]struct {
		owner string
		msg   *nats.Msg
		want  error
	}{
		"missing msg id": {owner, noID, ErrMissingMsgID},
		"nil message":    {owner, nil, ErrInvalidMsg},
		"wildcard":       {owner, wildcard, ErrInvalidMsg},
		"empty token":    {owner, &nats.Msg{Subject: "obt..x", Header: testMsg(3).Header}, ErrInvalidMsg},
		"reply subject":  {owner, withReply, ErrInvalidMsg},
		"no owner":       {"", testMsg(4), nil},
	} {
		t.Run(name, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				// A valid message first: nothing of the call may be inserted.
				return Insert(ctx, tx, tc.owner, testMsg(0), tc.msg)
			})
			require.Error(t, err)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			}
		})
	}
	require.Zero(t, b.pending(t))
}

func TestFlushPublishesInOrderOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, func(c *RelayConfig) { c.Batch = 10 })
	b.insert(t, owner, 0, 37)
	b.insert(t, "other", 100, 105)

	n, err := r.Flush(context.Background())
	require.NoError(t, err)
	require.Equal(t, 37, n)
	b.requireStreamHas(t, 0, 37)
	left := pgtest.Strings(t, b.pool, "SELECT owner FROM outbox")
	require.Len(t, left, 5)
	require.Equal(t, "other", left[0], "a relay publishes only its owner's rows")

	n, err = r.Flush(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 37.0, testutil.ToFloat64(r.metrics.published.WithLabelValues(owner)))
	require.Zero(t, testutil.ToFloat64(r.metrics.duplicates.WithLabelValues(owner)))
}

func TestKickWakesRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// An interval far longer than the test: only Kick can wake it.
	r := b.relay(t, func(c *RelayConfig) { c.Interval = time.Hour })
	require.NoError(t, r.Start(context.Background()))
	// The first round (nothing to publish) ends by setting the gauges;
	// after it the relay sleeps for an hour.
	require.Eventually(t, func() bool { return testutil.CollectAndCount(r.metrics.lag) == 1 }, 10*time.Second, 5*time.Millisecond)

	b.insert(t, owner, 0, 5)
	r.Kick()
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 10*time.Second, 10*time.Millisecond)
	b.requireStreamHas(t, 0, 5)

	require.NoError(t, r.Stop(context.Background()))
	require.NoError(t, r.Stop(context.Background()), "Stop is idempotent")
	require.Error(t, r.Start(context.Background()), "a stopped relay does not start again")
}

func TestIntervalPublishesWithoutKick(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, func(c *RelayConfig) { c.Interval = 20 * time.Millisecond })
	require.NoError(t, r.Start(context.Background()))
	b.insert(t, owner, 0, 3)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 10*time.Second, 10*time.Millisecond)
	b.requireStreamHas(t, 0, 3)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.metrics.pending.WithLabelValues(owner)) == 0
	}, 10*time.Second, 10*time.Millisecond)
}

// A relay that published a batch and died before deleting it leaves the
// rows; the next relay publishes them again and JetStream drops them as
// duplicates, so the stream holds each message once.
func TestCrashAfterPublishBeforeDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	crashed := b.relay(t, func(c *RelayConfig) { c.Batch = 8 })
	errCrash := errors.New("killed after publish")
	crashed.failpoint = func(context.Context, string) error { return errCrash }
	b.insert(t, owner, 0, 20)

	_, err := crashed.Flush(context.Background())
	require.ErrorIs(t, err, errCrash)
	require.Equal(t, 20, b.pending(t), "rows survive the crash")
	require.Len(t, b.streamMsgs(t), 8, "the first batch was published before the crash")

	next := b.relay(t, func(c *RelayConfig) { c.Batch = 8 })
	n, err := next.Flush(context.Background())
	require.NoError(t, err)
	require.Equal(t, 20, n)
	require.Zero(t, b.pending(t))
	b.requireStreamHas(t, 0, 20)
	require.Equal(t, 8.0, testutil.ToFloat64(next.metrics.duplicates.WithLabelValues(owner)))
}

// Two relays of the same owner running at once split the rows between
// them: every row is published by exactly one of them (the published
// counters add up to the row count, no duplicate acks).
func TestTwoRelaysConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 400
	b.insert(t, owner, 0, total)
	relays := []*Relay{
		b.relay(t, func(c *RelayConfig) { c.Batch = 16 }),
		b.relay(t, func(c *RelayConfig) { c.Batch = 16 }),
	}
	var wg sync.WaitGroup
	counts := make([]int, len(relays))
	for i, r := range relays {
		wg.Go(func() {
			for {
				var left int
				if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&left); err != nil || left == 0 {
					return
				}
				n, err := r.Flush(context.Background())
				if err != nil {
					t.Errorf("relay %d: %v", i, err)
					return
				}
				counts[i] += n
			}
		})
	}
	wg.Wait()
	require.Equal(t, total, counts[0]+counts[1])
	var published, dups float64
	for _, r := range relays {
		published += testutil.ToFloat64(r.metrics.published.WithLabelValues(owner))
		dups += testutil.ToFloat64(r.metrics.duplicates.WithLabelValues(owner))
	}
	require.Equal(t, float64(total), published)
	require.Zero(t, dups, "no row was published by both relays")
	require.Len(t, b.streamMsgs(t), total)
}

// NATS goes away: the relay records the failures on the rows, backs off,
// and publishes everything once NATS is back.
func TestNATSDownThenUp(t *testing.T) {
	t.Parallel()
	storeDir := t.TempDir()
	b := setup(t, natstest.WithStoreDir(storeDir))
	r := b.relay(t, func(c *RelayConfig) {
		c.Interval = 20 * time.Millisecond
		c.MaxBackoff = 100 * time.Millisecond
		c.AckTimeout = 200 * time.Millisecond
	})
	require.NoError(t, r.Start(context.Background()))
	b.insert(t, owner, 0, 3)
	r.Kick()
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 10*time.Second, 10*time.Millisecond)

	port := natstest.Port(b.srv)
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	b.insert(t, owner, 3, 10)
	r.Kick()
	require.Eventually(t, func() bool {
		var attempts int
		var lastErr string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT attempts, last_error FROM outbox ORDER BY id LIMIT 1").Scan(&attempts, &lastErr))
		return attempts >= 2 && lastErr != ""
	}, 10*time.Second, 10*time.Millisecond, "failures are recorded on the rows")
	require.Positive(t, testutil.ToFloat64(r.metrics.errors.WithLabelValues(owner)))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.metrics.pending.WithLabelValues(owner)) == 7 &&
			testutil.ToFloat64(r.metrics.lag.WithLabelValues(owner)) > 0
	}, 10*time.Second, 10*time.Millisecond, "the backlog shows in the gauges")

	b.srv = natstest.RunServer(t, natstest.WithPort(port), natstest.WithStoreDir(storeDir))
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 20*time.Second, 20*time.Millisecond)
	b.requireStreamHas(t, 0, 10)
}

// A row no stream accepts fails on its own; the rows around it are
// published and the relay keeps going.
func TestUnpublishableRowDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, func(c *RelayConfig) { c.Batch = 4 })
	b.insert(t, owner, 0, 2)
	stray := testMsg(99)
	stray.Subject = "nostream.x"
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Insert(ctx, tx, owner, stray) }))
	b.insert(t, owner, 2, 9)

	n, err := r.Flush(ctx)
	require.Error(t, err)
	require.Equal(t, 9, n)
	b.requireStreamHas(t, 0, 9)
	var subject, lastErr string
	var attempts int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT subject, attempts, last_error FROM outbox").Scan(&subject, &attempts, &lastErr))
	require.Equal(t, "nostream.x", subject)
	require.Equal(t, 1, attempts, "a failed row is tried once per Flush")
	require.NotEmpty(t, lastErr)
}

func TestRelayConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for field, mutate := range map[string]func(*RelayConfig){
		"RelayConfig.Pool":     func(c *RelayConfig) { c.Pool = nil },
		"RelayConfig.JS":       func(c *RelayConfig) { c.JS = nil },
		"RelayConfig.Owner":    func(c *RelayConfig) { c.Owner = "" },
		"RelayConfig.Batch":    func(c *RelayConfig) { c.Batch = -1 },
		"RelayConfig.Interval": func(c *RelayConfig) { c.Interval = -time.Second },
	} {
		cfg := RelayConfig{Pool: b.pool, JS: b.js, Owner: owner}
		mutate(&cfg)
		_, err := NewRelay(cfg)
		require.ErrorContains(t, err, field)
	}
	r, err := NewRelay(RelayConfig{Pool: b.pool, JS: b.js, Owner: owner})
	require.NoError(t, err)
	require.Equal(t, 256, r.cfg.Batch)
	require.Equal(t, time.Second, r.cfg.Interval)

	// Relays of several services share the registry of the dev runner.
	reg := prometheus.NewRegistry()
	for _, o := range []string{"a", "b"} {
		_, err := NewRelay(RelayConfig{Pool: b.pool, JS: b.js, Owner: o, Registerer: reg})
		require.NoError(t, err, fmt.Sprintf("owner %s", o))
	}
}

// A stream that is full (discard new, as retryd's streams are) refuses
// rows: they stay in the outbox, and once the stream has room they are
// published, each exactly once.
func TestFullStreamKeepsRowsUntilRoom(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	s, err := b.js.Stream(ctx, testStream)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.Discard = jetstream.DiscardNew
	cfg.MaxBytes = 1 << 10
	_, err = b.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	r := b.relay(t, func(c *RelayConfig) { c.Batch = 8 })
	b.insert(t, owner, 0, 20)

	n, err := r.Flush(ctx)
	require.ErrorContains(t, err, "maximum bytes exceeded")
	require.Positive(t, n)
	require.Less(t, n, 20, "1 KiB holds a few rows, not 20")
	b.requireStreamHas(t, 0, n)
	require.Equal(t, 20-n, b.pending(t), "every refused row stays")

	cfg.MaxBytes = 1 << 20
	_, err = b.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	m, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 20-n, m)
	b.requireStreamHas(t, 0, 20)
	require.Zero(t, b.pending(t))
	require.Zero(t, testutil.ToFloat64(r.metrics.duplicates.WithLabelValues(owner)), "none was stored before")
}
