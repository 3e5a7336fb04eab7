package streams_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// oldConfigs are the streams as versions before max_bytes created them:
// no limit, discard old.
func oldConfigs() []jetstream.StreamConfig {
	cfgs := streams.Configs(streams.Options{})
	for i := range cfgs {
		cfgs[i].MaxBytes = -1
		cfgs[i].Discard = jetstream.DiscardOld // SCHEDULES's still
	}
	return cfgs
}

// An existing deployment's streams get the limits and discard new in
// place: same streams, same messages.
func TestEnsureUpgradesStreamsWithoutLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, cfg := range oldConfigs() {
		_, err := b.js.CreateStream(b.ctx, cfg)
		require.NoError(t, err, cfg.Name)
	}
	ack, err := b.js.Publish(b.ctx, contract.RetrySubject("event", contract.Failed, "a"), []byte(`{}`))
	require.NoError(t, err)
	before, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)

	drift, err := streams.CreateMissing(b.ctx, b.js, streams.Options{})
	require.NoError(t, err)
	require.Equal(t, []string{"INGEST: discard", "EVENTS: discard", "RETRIES: discard", "RUNS: discard", "JOBS: discard"}, drift,
		"the services report every old stream but SCHEDULES, which is unchanged")

	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	for _, want := range streams.Configs(streams.Options{}) {
		got := b.config(t, want.Name)
		require.Equal(t, want.MaxBytes, got.MaxBytes, want.Name)
		require.Equal(t, want.Discard, got.Discard, want.Name)
	}
	require.Equal(t, jetstream.DiscardNew, b.config(t, contract.StreamRetries).Discard)
	s, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	info, err := s.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "updated, not recreated")
	require.Equal(t, ack.Sequence, info.State.FirstSeq)
	require.Equal(t, before.CachedInfo().Created, info.Created)

	drift, err = streams.CreateMissing(b.ctx, b.js, streams.Options{})
	require.NoError(t, err)
	require.Empty(t, drift)
}

// A max_bytes an operator set is kept unless the options name the stream;
// named, it is applied.
func TestEnsureKeepsOperatorMaxBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamRetries, 3*streams.GiB)

	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	require.Equal(t, 3*streams.GiB, b.config(t, contract.StreamRetries).MaxBytes, "nats stream edit is kept")

	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{MaxBytes: map[string]int64{contract.StreamRetries: 5 * streams.GiB}}))
	require.Equal(t, 5*streams.GiB, b.config(t, contract.StreamRetries).MaxBytes)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{MaxBytes: map[string]int64{contract.StreamRetries: -1}}))
	require.EqualValues(t, -1, b.config(t, contract.StreamRetries).MaxBytes)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	require.Equal(t, streams.DefaultMaxBytes[contract.StreamRetries], b.config(t, contract.StreamRetries).MaxBytes,
		"no limit is the old default: it gets the new one")
}

// A limit below what a stream stores would make it refuse everything:
// Ensure says so and changes no stream.
func TestEnsureRefusesMaxBytesBelowStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	for i := range 2 {
		_, err := b.js.Publish(b.ctx, contract.IngestSubject("shop"), make([]byte, 700*streams.KiB))
		require.NoError(t, err, "message %d", i)
	}
	opts := streams.Options{
		MaxBytes: map[string]int64{contract.StreamIngest: streams.MiB},
		MaxAge:   map[string]time.Duration{contract.StreamJobs: time.Hour},
	}
	err := streams.Ensure(b.ctx, b.js, opts)
	require.ErrorContains(t, err, "ensure stream INGEST: it stores")
	require.ErrorContains(t, err, "RETRYD_STREAM_INGEST_MAX_BYTES")
	require.Equal(t, streams.DefaultMaxBytes[contract.StreamIngest], b.config(t, contract.StreamIngest).MaxBytes)
	require.Equal(t, streams.DefaultMaxAge, b.config(t, contract.StreamJobs).MaxAge, "no stream was changed")
}

// A full stream refuses the next message with an error Full recognises,
// keeps every message it stored, and stores the refused one, once, when
// it has room again.
func TestFullStreamRefusesAndKeeps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	// Below what Options allows: the server takes it, and a few messages
	// fill it.
	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamEvents, 2*streams.KiB)

	msg := func(i int) *nats.Msg {
		m := nats.NewMsg(contract.EventSubject("shop", "invoice.paid"))
		m.Header.Set(contract.HeaderMsgID, fmt.Sprintf("e%d", i))
		m.Data = make([]byte, 200)
		return m
	}
	stored, refused := 0, -1
	for i := range 100 {
		_, err := b.js.PublishMsg(b.ctx, msg(i))
		if err != nil {
			require.True(t, streams.Full(err), "%v", err)
			refused = i
			break
		}
		stored++
	}
	require.Positive(t, refused, "2 KiB hold some 200-byte messages, not 100")
	require.False(t, streams.Full(errors.New("maximum bytes exceeded")), "only JetStream's error")
	require.False(t, streams.Full(jetstream.ErrStreamNotFound))

	s, err := b.js.Stream(b.ctx, contract.StreamEvents)
	require.NoError(t, err)
	info, err := s.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(stored), info.State.Msgs)
	require.Equal(t, uint64(1), info.State.FirstSeq, "nothing old was discarded")

	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamEvents, streams.DefaultMaxBytes[contract.StreamEvents])
	ack, err := b.js.PublishMsg(b.ctx, msg(refused))
	require.NoError(t, err)
	require.False(t, ack.Duplicate, "the refused message was not stored")
	ack, err = b.js.PublishMsg(b.ctx, msg(refused))
	require.NoError(t, err)
	require.True(t, ack.Duplicate, "stored once")
}

func TestParseBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"1073741824": streams.GiB, "8GiB": 8 * streams.GiB, "512 MiB": 512 * streams.MiB,
		"64KiB": 64 * streams.KiB, "1TiB": 1 << 40, "-1": -1,
	} {
		got, err := streams.ParseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "0", "-2", "8GB", "1.5GiB", "GiB", "-1GiB", "99999999999TiB"} {
		_, err := streams.ParseBytes(in)
		require.ErrorContains(t, err, "must be a size", in)
	}
}

// Not parallel: it sets environment variables.
func TestOptionsFromEnv(t *testing.T) {
	t.Setenv("RETRYD_STREAM_RETRIES_MAX_BYTES", "8GiB")
	t.Setenv("RETRYD_STREAM_INGEST_MAX_BYTES", "-1")
	t.Setenv("RETRYD_STREAM_RETRIES_MAX_AGE", "2160h")
	var e envvar.Reader
	opts := streams.OptionsFromEnv(&e)
	require.NoError(t, e.Err())
	require.Equal(t, map[string]int64{"RETRIES": 8 * streams.GiB, "INGEST": -1}, opts.MaxBytes)
	require.Equal(t, map[string]time.Duration{"RETRIES": 90 * 24 * time.Hour}, opts.MaxAge)

	t.Setenv("RETRYD_STREAM_JOBS_MAX_BYTES", "lots")
	t.Setenv("RETRYD_STREAM_EVENTS_MAX_BYTES", "1000")
	e = envvar.Reader{}
	streams.OptionsFromEnv(&e)
	require.ErrorContains(t, e.Err(), "RETRYD_STREAM_JOBS_MAX_BYTES: must be a size")
	require.ErrorContains(t, e.Err(), "Options.MaxBytes[EVENTS]")
}
