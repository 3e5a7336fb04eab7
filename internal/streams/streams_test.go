package streams_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

type bundle struct {
	js  jetstream.JetStream
	ctx context.Context
}

func setup(t *testing.T) bundle {
	t.Helper()
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return bundle{js: js, ctx: ctx}
}

func (b bundle) config(t *testing.T, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := b.js.Stream(b.ctx, name)
	require.NoError(t, err, name)
	info, err := s.Info(b.ctx)
	require.NoError(t, err)
	return info.Config
}

func TestConfigsDocumentedChoices(t *testing.T) {
	t.Parallel()
	cfgs := streams.Configs(streams.Options{})
	names := make([]string, 0, len(cfgs))
	for _, c := range cfgs {
		names = append(names, c.Name)
		require.Equal(t, jetstream.LimitsPolicy, c.Retention, c.Name)
		require.Equal(t, jetstream.FileStorage, c.Storage, c.Name)
		if c.Name == contract.StreamSchedules {
			// The server refuses discard new with message schedules.
			require.Equal(t, jetstream.DiscardOld, c.Discard)
		} else {
			require.Equal(t, jetstream.DiscardNew, c.Discard, c.Name, "a full stream refuses, it deletes nothing")
		}
		require.Equal(t, streams.DefaultMaxBytes[c.Name], c.MaxBytes, c.Name)
		require.GreaterOrEqual(t, c.MaxBytes, int64(streams.MaxMsgSize), c.Name)
		require.Equal(t, 2*time.Minute, c.Duplicates, c.Name)
		require.Equal(t, int32(contract.MaxEnvelopeBytes), c.MaxMsgSize, c.Name)
		require.Equal(t, 1, c.Replicas, c.Name)
		require.NotEmpty(t, c.Description, c.Name)
		want := 7 * 24 * time.Hour
		switch c.Name {
		case contract.StreamRetries:
			want = 30 * 24 * time.Hour
		case contract.StreamSchedules:
			want = 0 // a schedule lives until deleted; fired jobs expire by their TTL
		}
		require.Equal(t, c.Name == contract.StreamSchedules, c.AllowMsgSchedules, c.Name)
		require.Equal(t, want, c.MaxAge, c.Name)
	}
	require.Equal(t, []string{"INGEST", "EVENTS", "RETRIES", "RUNS", "SCHEDULES", "JOBS"}, names)
	require.Equal(t, streams.Names, names)
	var total int64
	for _, n := range streams.DefaultMaxBytes {
		total += n
	}
	require.Len(t, streams.DefaultMaxBytes, len(streams.Names), "every stream")
	require.Equal(t, 10*streams.GiB, total, "the sum the docs and deploy/nats's max_file_store are sized for")
	big, _ := streams.Config("RETRIES", streams.Options{MaxBytes: map[string]int64{"RETRIES": 16 * streams.GiB}})
	require.Equal(t, 16*streams.GiB, big.MaxBytes)
	open, _ := streams.Config("INGEST", streams.Options{MaxBytes: map[string]int64{"INGEST": -1}})
	require.EqualValues(t, -1, open.MaxBytes)

	r3 := streams.Configs(streams.Options{Replicas: 3, MaxAge: map[string]time.Duration{"JOBS": time.Hour}})
	for _, c := range r3 {
		require.Equal(t, 3, c.Replicas)
	}
	jobs, ok := streams.Config("JOBS", streams.Options{MaxAge: map[string]time.Duration{"JOBS": time.Hour}})
	require.True(t, ok)
	require.Equal(t, time.Hour, jobs.MaxAge)
	_, ok = streams.Config("NOPE", streams.Options{})
	require.False(t, ok)
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		opts streams.Options
		want string
	}{
		{streams.Options{Replicas: -1}, "Options.Replicas"},
		{streams.Options{Replicas: 6}, "Options.Replicas"},
		{streams.Options{Storage: jetstream.StorageType(7)}, "Options.Storage"},
		{streams.Options{MaxAge: map[string]time.Duration{"retries": time.Hour}}, `"retries" is not a retryd stream`},
		{streams.Options{MaxAge: map[string]time.Duration{"RETRIES": time.Second}}, "Options.MaxAge[RETRIES]"},
		{streams.Options{MaxBytes: map[string]int64{"ingest": streams.GiB}}, `Options.MaxBytes: "ingest" is not a retryd stream`},
		{streams.Options{MaxBytes: map[string]int64{"INGEST": 4096}}, "Options.MaxBytes[INGEST] must be -1 (no limit) or at least the max message size"},
		{streams.Options{MaxBytes: map[string]int64{"INGEST": 0}}, "Options.MaxBytes[INGEST]"},
		{streams.Options{MaxBytes: map[string]int64{"SCHEDULES": 4096}}, "Options.MaxBytes[SCHEDULES] must be -1 (no limit) or at least the max message size"},
	}
	for _, tc := range tests {
		require.ErrorContains(t, tc.opts.Validate(), tc.want)
		require.ErrorContains(t, streams.Export(t.TempDir(), tc.opts), tc.want)
		// Ensure refuses before talking to any server.
		require.ErrorContains(t, streams.Ensure(context.Background(), nil, tc.opts), tc.want)
	}
	require.NoError(t, streams.Options{Replicas: 3, Storage: jetstream.MemoryStorage}.Validate())
}

func TestEnsureTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	_, err := b.js.Publish(b.ctx, contract.RetrySubject("event", contract.Failed, "a"), []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))

	for _, want := range streams.Configs(streams.Options{}) {
		got := b.config(t, want.Name)
		require.Equal(t, want.Subjects, got.Subjects)
		require.Equal(t, want.MaxAge, got.MaxAge)
		require.Equal(t, want.Duplicates, got.Duplicates)
		require.Equal(t, want.MaxMsgSize, got.MaxMsgSize)
		require.Equal(t, want.Retention, got.Retention)
		require.Equal(t, want.Storage, got.Storage)
		require.Equal(t, want.Discard, got.Discard)
		require.Equal(t, want.Description, got.Description)
	}
	// Ensuring again kept the message.
	s, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.Equal(t, uint64(1), s.CachedInfo().State.Msgs)
}

func TestEnsureAfterDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	require.NoError(t, b.js.DeleteStream(b.ctx, contract.StreamRetries))
	_, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)

	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	got := b.config(t, contract.StreamRetries)
	require.Equal(t, streams.DefaultRetriesMaxAge, got.MaxAge)
	ack, err := b.js.Publish(b.ctx, contract.RetrySubject("job", contract.Due, "x"), []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, contract.StreamRetries, ack.Stream)
}

func TestEnsureUpdatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	longer := streams.Options{MaxAge: map[string]time.Duration{contract.StreamRetries: 90 * 24 * time.Hour}}
	require.NoError(t, streams.Ensure(b.ctx, b.js, longer))
	require.Equal(t, 90*24*time.Hour, b.config(t, contract.StreamRetries).MaxAge)
	require.Equal(t, streams.DefaultMaxAge, b.config(t, contract.StreamJobs).MaxAge)

	// A stream someone changed by hand is put back.
	cfg := b.config(t, contract.StreamJobs)
	cfg.Duplicates = 10 * time.Second
	_, err := b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	require.Equal(t, streams.DuplicateWindow, b.config(t, contract.StreamJobs).Duplicates)
	require.Equal(t, streams.DefaultRetriesMaxAge, b.config(t, contract.StreamRetries).MaxAge)
}

func TestEnsureRefusesStorageChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Storage: jetstream.MemoryStorage}))
	err := streams.Ensure(b.ctx, b.js, streams.Options{})
	require.ErrorContains(t, err, "ensure stream INGEST")
	require.Equal(t, jetstream.MemoryStorage, b.config(t, contract.StreamIngest).Storage, "nothing deleted or changed")
}

func TestEnsureConcurrent(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const callers = 8
	jss := make([]jetstream.JetStream, callers)
	for i := range jss {
		_, jss[i] = natstest.Connect(t, srv)
	}
	var wg sync.WaitGroup
	errs := make([]error, callers)
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			errs[i] = streams.Ensure(ctx, jss[i], streams.Options{})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "caller %d", i)
	}
	names := jss[0].StreamNames(ctx)
	var got []string
	for n := range names.Name() {
		got = append(got, n)
	}
	require.NoError(t, names.Err())
	require.ElementsMatch(t, streams.Names, got)
}

// Every builder of the contract publishes into the stream it belongs to,
// and the streams' subjects do not overlap (the server refuses overlaps).
func TestContractSubjectsLandInTheirStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

	env := contract.Envelope{SpecVersion: contract.SpecVersion, ID: "01JEVENT", Source: "shop", Type: "invoice.paid", Time: now}
	ingest, err := contract.NewEventMsg(contract.IngestSubject("shop"), env)
	require.NoError(t, err)
	events, err := contract.NewEventMsg(contract.EventSubject("shop", "invoice.paid"), env)
	require.NoError(t, err)
	failed, err := contract.NewLifecycleMsg("test", contract.Failed, contract.FailedData{Kind: "event", ID: "01JEVENT", Attempt: 1, Error: contract.ErrorInfo{Class: "timeout", Message: "slow"}}, now)
	require.NoError(t, err)
	run, err := contract.NewRunMsg("test", contract.RunRequested, contract.RunRequestedData{RunID: "r1", Workflow: "billing", TriggerID: "t1", DeliveryID: "d1", EventID: "01JEVENT"}, now)
	require.NoError(t, err)
	job, err := contract.NewJobMsg("test", contract.JobData{ID: "j1", JobType: "email", Attempt: 1}, now)
	require.NoError(t, err)

	for _, tc := range []struct {
		stream string
		subj   string
		pub    func() (*jetstream.PubAck, error)
	}{
		{contract.StreamIngest, ingest.Subject, func() (*jetstream.PubAck, error) { return b.js.PublishMsg(b.ctx, ingest) }},
		{contract.StreamEvents, events.Subject, func() (*jetstream.PubAck, error) { return b.js.PublishMsg(b.ctx, events) }},
		{contract.StreamRetries, failed.Subject, func() (*jetstream.PubAck, error) { return b.js.PublishMsg(b.ctx, failed) }},
		{contract.StreamRuns, run.Subject, func() (*jetstream.PubAck, error) { return b.js.PublishMsg(b.ctx, run) }},
		{contract.StreamJobs, job.Subject, func() (*jetstream.PubAck, error) { return b.js.PublishMsg(b.ctx, job) }},
	} {
		ack, err := tc.pub()
		require.NoError(t, err, tc.subj)
		require.Equal(t, tc.stream, ack.Stream, tc.subj)
		ack, err = tc.pub()
		require.NoError(t, err, tc.subj)
		require.True(t, ack.Duplicate, "%s: same Nats-Msg-Id inside the window is dropped", tc.subj)
	}
}

func TestStreamsRefuseMessagesOverMaxMsgSize(t *testing.T) {
	t.Parallel()
	// The server's own max_payload is raised so that the stream's limit is
	// the one that refuses.
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) { o.MaxPayload = 4 << 20 }))
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	require.NoError(t, streams.Ensure(ctx, js, streams.Options{}))

	_, err := js.Publish(ctx, contract.JobSubject("email"), make([]byte, contract.MaxEnvelopeBytes+1))
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, jetstream.JSErrCodeStreamMessageExceedsMaximum, apiErr.ErrorCode, err.Error())
	_, err = js.Publish(ctx, contract.JobSubject("email"), make([]byte, contract.MaxEnvelopeBytes-1024))
	require.NoError(t, err)
}

// The largest message the contract builds is one the streams store: the
// builders count headers the way the server does.
func TestLargestContractMessageIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	payload := json.RawMessage(`"` + strings.Repeat("p", contract.MaxDataBytes-2) + `"`)
	// One time for every build: RFC 3339 drops trailing zeros of the
	// nanoseconds, so time.Now() per build changes the size by a byte or
	// two between the search and the publish.
	at := time.Date(2026, 11, 23, 20, 0, 0, 123456789, time.UTC)
	build := func(n int) (*nats.Msg, error) {
		return contract.NewLifecycleMsg("retryd/scheduler", contract.Due, contract.DueData{
			Kind: "job", ID: "j1", Attempt: 2, Payload: payload,
			Checkpoint: json.RawMessage(`"` + strings.Repeat("c", n) + `"`),
		}, at)
	}
	lo, hi := 0, contract.MaxDataBytes-2 // lo builds, hi does not
	_, err := build(hi)
	require.ErrorIs(t, err, contract.ErrTooLarge)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if _, err := build(mid); err == nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	msg, err := build(lo)
	require.NoError(t, err)
	ack, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	require.Equal(t, contract.StreamRetries, ack.Stream)

	// The same message with a few more header bytes is what the builder
	// refused: the stream refuses it too.
	msg.Header.Set(contract.HeaderMsgID, msg.Header.Get(contract.HeaderMsgID)+"-x")
	msg.Header.Set("X", "y")
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.Error(t, err)
}

// CreateMissing is what the services run: it recreates a deleted stream
// and never changes an existing one, whose differences it reports.
func TestCreateMissingLeavesExistingStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	drift, err := streams.CreateMissing(b.ctx, b.js, streams.Options{})
	require.NoError(t, err)
	require.Empty(t, drift, "streams it created itself match")

	cfg := b.config(t, contract.StreamJobs)
	cfg.Duplicates = 10 * time.Second
	cfg.MaxMsgs = 5
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, b.js.DeleteStream(b.ctx, contract.StreamRuns))

	drift, err = streams.CreateMissing(b.ctx, b.js, streams.Options{})
	require.NoError(t, err)
	require.Equal(t, []string{"JOBS: duplicate_window"}, drift, "max_msgs is an operator's limit, not compared")
	require.Equal(t, 10*time.Second, b.config(t, contract.StreamJobs).Duplicates, "an existing stream is left as it is")
	require.EqualValues(t, 5, b.config(t, contract.StreamJobs).MaxMsgs)
	require.Equal(t, streams.DuplicateWindow, b.config(t, contract.StreamRuns).Duplicates, "a deleted stream is created again")

	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	drift, err = streams.CreateMissing(b.ctx, b.js, streams.Options{})
	require.NoError(t, err)
	require.Empty(t, drift, "Ensure (the admin's) put it back")
}

// The collector reports each stream's size and the account's storage,
// read from the server at each scrape.
func TestCollectorReportsStreamSizes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	msg := nats.NewMsg("jobs.collect")
	msg.Data = []byte(`{}`)
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(streams.NewCollector(b.js)))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "/" + l.GetValue()
			}
			got[key] = m.GetGauge().GetValue()
		}
	}
	require.Equal(t, 1.0, got["retryd_stream_messages/JOBS"])
	require.Positive(t, got["retryd_stream_bytes/JOBS"])
	require.Zero(t, got["retryd_stream_messages/RETRIES"])
	require.Contains(t, got, "retryd_jetstream_storage_bytes")
	require.Equal(t, float64(streams.DefaultMaxBytes["JOBS"]), got["retryd_stream_max_bytes/JOBS"])

	// A stream without a limit has no series: the alert cannot divide by it.
	cfg := b.config(t, contract.StreamRuns)
	cfg.MaxBytes = -1
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	families, err = reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				require.False(t, f.GetName() == "retryd_stream_max_bytes" && l.GetValue() == "RUNS", "no max_bytes, no series")
			}
		}
	}
}
