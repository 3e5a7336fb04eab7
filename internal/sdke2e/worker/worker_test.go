package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/workertest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

const wait = 15 * time.Second

type bundle struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	reg *prometheus.Registry
	// outcomes reads the job outcomes (failed, succeeded, held) in order.
	outcomes jetstream.Consumer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	cons, err := js.OrderedConsumer(context.Background(), contract.StreamRetries, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"retry.job.failed.*", "retry.job.succeeded.*", "retry.job.held.*"},
	})
	require.NoError(t, err)
	return &bundle{nc: nc, js: js, reg: prometheus.NewRegistry(), outcomes: cons}
}

func (b *bundle) newWorker(t *testing.T, cfg worker.Config, handlers map[string]worker.Handler) *worker.Worker {
	t.Helper()
	if cfg.JS == nil {
		cfg.JS = b.js
	}
	if cfg.Registerer == nil {
		cfg.Registerer = b.reg
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return workertest.Start(t, context.Background(), cfg, handlers)
}

// collect starts a worker whose handler for jobType succeeds and hands
// each job it ran to the channel, which holds n.
func (b *bundle) collect(t *testing.T, jobType string, n int) <-chan *worker.Job {
	t.Helper()
	jobs := make(chan *worker.Job, n)
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		jobType: func(_ context.Context, job *worker.Job) error {
			jobs <- job
			return nil
		},
	})
	return jobs
}

// nextOutcome returns the next failed, succeeded or held event.
func (b *bundle) nextOutcome(t *testing.T) contract.LifecycleEvent {
	t.Helper()
	msg, err := b.outcomes.Next(jetstream.FetchMaxWait(wait))
	require.NoError(t, err, "no outcome published")
	ev, err := contract.DecodeLifecycle(msg.Subject(), msg.Data())
	require.NoError(t, err)
	return ev
}

// noOutcome checks that nothing more was published.
func (b *bundle) noOutcome(t *testing.T) {
	t.Helper()
	s, err := b.js.Stream(context.Background(), contract.StreamRetries)
	require.NoError(t, err)
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter("retry.job.>"))
	require.NoError(t, err)
	_, err = b.outcomes.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
	require.ErrorIs(t, err, nats.ErrTimeout, "unexpected outcome (stream holds %d messages)", info.State.Msgs)
}

func (b *bundle) enqueue(t *testing.T, job contract.JobData) string {
	t.Helper()
	id, err := worker.Enqueue(context.Background(), b.js, job)
	require.NoError(t, err)
	return id
}

// enqueueWithOverrides enqueues a job of jobType with payload, tenant t1's
// metadata and every per-job override (maxRetries, retries enabled, a
// 60s timeout), for the tests that check an outcome carries them on.
func (b *bundle) enqueueWithOverrides(t *testing.T, jobType, payload string, maxRetries int) string {
	t.Helper()
	enabled := true
	return b.enqueue(t, contract.JobData{
		JobType: jobType, Payload: json.RawMessage(payload),
		MaxRetries: &maxRetries, RetryEnabled: &enabled, TimeoutMS: 60_000,
		Metadata: map[string]string{"tenant": "t1"},
	})
}

// ackPending returns how many messages the consumer has delivered and not
// yet seen acked or terminated.
func (b *bundle) consumerInfo(t *testing.T, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := b.js.Consumer(context.Background(), stream, name)
	require.NoError(t, err)
	info, err := c.Info(context.Background())
	require.NoError(t, err)
	return info
}

func (b *bundle) settled(t *testing.T, stream, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		info := b.consumerInfo(t, stream, name)
		return info.NumAckPending == 0 && info.NumPending == 0
	}, wait, 10*time.Millisecond, "consumer %s did not settle", name)
}

func TestSucceededIsPublishedThenAcked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var got atomic.Pointer[worker.Job]
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"email": func(_ context.Context, job *worker.Job) error {
			got.Store(job)
			return nil
		},
	})
	id := b.enqueue(t, contract.JobData{JobType: "email", Payload: json.RawMessage(`{"to":"a@example.com"}`)})

	ev := b.nextOutcome(t)
	require.Equal(t, contract.Succeeded, ev.Event)
	require.Equal(t, id, ev.ID)
	require.Equal(t, 1, ev.Succeeded.Attempt)
	require.Equal(t, contract.LifecycleMsgID(contract.KindJob, contract.Succeeded, id, 1), ev.Envelope.ID)
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%s-%d", host, os.Getpid()), ev.Succeeded.Executor, "the default executor is host name and pid")
	b.settled(t, contract.StreamJobs, "worker-email")

	job := got.Load()
	require.Equal(t, id, job.ID)
	require.Equal(t, "email", job.Type)
	require.Equal(t, 1, job.Attempt)
	require.JSONEq(t, `{"to":"a@example.com"}`, string(job.Payload))
	require.Empty(t, job.Checkpoint)
	require.Equal(t, id+":1", job.IdempotencyKey())
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_attempts_total", "email", "succeeded"))
}

func TestFailuresAreClassified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.newWorker(t, worker.Config{Grace: 200 * time.Millisecond}, map[string]worker.Handler{
		"typed": func(context.Context, *worker.Job) error {
			return errclass.New(errclass.Validation, "email address is missing")
		},
		"pattern": func(context.Context, *worker.Job) error { return errors.New("HTTP status 429: too many requests") },
		"unknown": func(context.Context, *worker.Job) error { return errors.New("something odd") },
		"hint": func(context.Context, *worker.Job) error {
			return errclass.RetryAfter(errclass.ErrRateLimit, 90*time.Second)
		},
		"nonretryable": func(context.Context, *worker.Job) error { return errclass.NonRetryable(errors.New("account closed")) },
		"panics":       func(context.Context, *worker.Job) error { panic("boom") },
		"slow": func(ctx context.Context, _ *worker.Job) error {
			<-ctx.Done()
			return ctx.Err()
		},
		"stubborn": func(ctx context.Context, _ *worker.Job) error {
			// Ignores its context: reported as a timeout after the grace.
			time.Sleep(time.Second)
			return nil
		},
	})
	cases := []struct {
		typ        string
		timeout    int64
		class      errclass.Class
		message    string
		retryAfter time.Duration
		final      bool
	}{
		{typ: "typed", class: errclass.Validation, message: "email address is missing"},
		{typ: "pattern", class: errclass.RateLimit, message: "HTTP status 429: too many requests"},
		{typ: "unknown", class: errclass.Unknown, message: "something odd"},
		{typ: "hint", class: errclass.RateLimit, message: "rate_limit", retryAfter: 90 * time.Second},
		{typ: "nonretryable", class: errclass.Unknown, message: "account closed", final: true},
		{typ: "panics", class: errclass.Temporary, message: "handler panicked: boom"},
		{typ: "slow", timeout: 50, class: errclass.Timeout, message: "attempt timed out after 50ms: context deadline exceeded"},
		{typ: "stubborn", timeout: 50, class: errclass.Timeout, message: "attempt timed out after 50ms: handler did not return within 200ms after its context ended: context deadline exceeded"},
	}
	for _, tc := range cases {
		id := b.enqueue(t, contract.JobData{JobType: tc.typ, TimeoutMS: tc.timeout})
		ev := b.nextOutcome(t)
		require.Equal(t, contract.Failed, ev.Event, tc.typ)
		f := ev.Failed
		require.Equal(t, id, f.ID, tc.typ)
		require.Equal(t, tc.typ, f.JobType)
		require.Equal(t, string(tc.class), f.Error.Class, tc.typ)
		require.Equal(t, tc.message, f.Error.Message, tc.typ)
		if tc.retryAfter > 0 {
			require.NotNil(t, f.RetryAfter, tc.typ)
			require.Equal(t, tc.retryAfter, f.RetryAfter.After, tc.typ)
		} else {
			require.Nil(t, f.RetryAfter, tc.typ)
		}
		require.Equal(t, tc.final, f.Error.NonRetryable, tc.typ)
		require.Nil(t, f.RetryEnabled, tc.typ)
	}
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_attempts_total", "panics", "panicked"))
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_attempts_total", "slow", "timed_out"))
}

func TestFailedCarriesPayloadCheckpointAndOverrides(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.newWorker(t, worker.Config{ExecutorID: "Enrich-Pod.7 (blue)"}, map[string]worker.Handler{
		"enrich": func(_ context.Context, job *worker.Job) error {
			if err := job.SetCheckpoint(map[string]any{"step": "fetch", "rows": 10}); err != nil {
				return err
			}
			return errors.New("connection reset by peer")
		},
	})
	id := b.enqueueWithOverrides(t, "enrich", `{"company":"acme"}`, 7)
	ev := b.nextOutcome(t)
	f := ev.Failed
	require.Equal(t, id, f.ID)
	require.Equal(t, 1, f.Attempt)
	require.Equal(t, "network", f.Error.Class)
	require.JSONEq(t, `{"company":"acme"}`, string(f.Payload))
	require.JSONEq(t, `{"step":"fetch","rows":10}`, string(f.Checkpoint))
	require.Equal(t, 7, *f.MaxRetries)
	require.True(t, *f.RetryEnabled)
	require.EqualValues(t, 60_000, f.TimeoutMS)
	require.Equal(t, map[string]string{"tenant": "t1"}, f.Metadata, "the overrides are fields, not metadata")
	require.Equal(t, "Enrich-Pod.7 (blue)", f.Executor, "the failed fact names the instance that ran the attempt")
	require.Equal(t, contract.LifecycleMsgID(contract.KindJob, contract.Failed, id, 1), ev.Envelope.ID)
	b.settled(t, contract.StreamJobs, "worker-enrich")
}

// publishDue publishes a due event as the scheduler would.
func publishDue(t *testing.T, js jetstream.JetStream, d contract.DueData) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("retryd/scheduler", contract.Due, d, time.Now())
	require.NoError(t, err)
	_, err = js.PublishMsg(context.Background(), msg)
	require.NoError(t, err)
}

func TestDueIsRoutedAndResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs := b.collect(t, "steps", 4)
	due := contract.DueData{
		Kind: contract.KindJob, ID: "job-1", Attempt: 3, NextAttemptAt: time.Now(), JobType: "steps",
		Payload: json.RawMessage(`{"n":1}`), Checkpoint: json.RawMessage(`{"step":"two"}`),
		//lint:ignore SA1019 the dues of an older scheduler carry the deprecated keys, which the router must still read
		Metadata: map[string]string{"tenant": "t1", worker.MetaMaxRetries: "2", worker.MetaTimeoutMS: "1500", worker.MetaRetryEnabled: "nope"},
	}
	publishDue(t, b.js, due)

	var job *worker.Job
	select {
	case job = <-jobs:
	case <-time.After(wait):
		t.Fatal("routed job never ran")
	}
	require.Equal(t, "job-1", job.ID)
	require.Equal(t, 3, job.Attempt)
	require.Equal(t, "job-1:3", job.IdempotencyKey())
	require.JSONEq(t, `{"step":"two"}`, string(job.Checkpoint))
	var cp struct{ Step string }
	ok, err := job.DecodeCheckpoint(&cp)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "two", cp.Step)
	require.Equal(t, 2, *job.MaxRetries, "a due from an older scheduler: the override in metadata")
	require.Nil(t, job.RetryEnabled, "an override that does not parse is dropped")
	require.Equal(t, map[string]string{"tenant": "t1"}, job.Metadata)

	// The job message carries the due's id, so routing it again (a second
	// router, a redelivery) stores nothing new.
	s, err := b.js.Stream(context.Background(), contract.StreamJobs)
	require.NoError(t, err)
	raw, err := s.GetLastMsgForSubject(context.Background(), "jobs.steps")
	require.NoError(t, err)
	require.Equal(t, "job-retry:job-1:3", raw.Header.Get(contract.HeaderMsgID))
	_, data, err := contract.DecodeJob(raw.Subject, raw.Data)
	require.NoError(t, err)
	require.Equal(t, int64(1500), data.TimeoutMS)
	jm, err := contract.NewJobMsg("other-router", data, time.Now())
	require.NoError(t, err)
	ack, err := b.js.PublishMsg(context.Background(), jm)
	require.NoError(t, err)
	require.True(t, ack.Duplicate)
	b.settled(t, contract.StreamRetries, worker.DueRouterDurable)
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_routed_total"))
}

// A due carries the job's overrides as fields; a stray reserved metadata
// key (what dues of older schedulers carried) does not override them.
func TestDueWithOverrideFieldsIsRouted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs := b.collect(t, "steps", 1)
	var job *worker.Job
	maxRetries, disabled := 4, false
	publishDue(t, b.js, contract.DueData{
		Kind: contract.KindJob, ID: "job-2", Attempt: 2, NextAttemptAt: time.Now(), JobType: "steps",
		MaxRetries: &maxRetries, RetryEnabled: &disabled, TimeoutMS: 2500,
		//lint:ignore SA1019 a due field wins over the deprecated key an older scheduler sent
		Metadata: map[string]string{"tenant": "t2", worker.MetaMaxRetries: "9"},
	})
	select {
	case job = <-jobs:
	case <-time.After(wait):
		t.Fatal("routed job never ran")
	}
	require.Equal(t, "job-2", job.ID)
	require.Equal(t, 4, *job.MaxRetries)
	require.False(t, *job.RetryEnabled)
	require.Equal(t, 2500*time.Millisecond, job.Timeout)
	require.Equal(t, map[string]string{"tenant": "t2"}, job.Metadata)
}

func TestMalformedMessagesAreTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := make(chan string, 4)
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"email": func(_ context.Context, job *worker.Job) error {
			ran <- job.ID
			return nil
		},
	})
	ctx := context.Background()
	bad := [][]byte{
		[]byte(`not json`),
		[]byte(`{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":{"id":"a.b","job_type":"email","attempt":1}}`),
		[]byte(`{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":{"id":"a","job_type":"sms","attempt":1}}`),
	}
	for i, body := range bad {
		msg := nats.NewMsg("jobs.email")
		msg.Data = body
		msg.Header.Set(contract.HeaderMsgID, fmt.Sprintf("bad-%d", i))
		_, err := b.js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	// A due without a job type cannot be routed.
	publishDue(t, b.js, contract.DueData{Kind: contract.KindJob, ID: "j", Attempt: 2, NextAttemptAt: time.Now()})
	// A good job behind the bad ones still runs.
	id := b.enqueue(t, contract.JobData{JobType: "email"})
	select {
	case got := <-ran:
		require.Equal(t, id, got)
	case <-time.After(wait):
		t.Fatal("good job did not run")
	}
	b.settled(t, contract.StreamJobs, "worker-email")
	b.settled(t, contract.StreamRetries, worker.DueRouterDurable)
	require.Equal(t, 3.0, metric(t, b.reg, "retryd_worker_malformed_total", "worker-email"))
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_malformed_total", "worker-due-router"))
	info := b.consumerInfo(t, contract.StreamJobs, "worker-email")
	require.Zero(t, info.NumRedelivered, "terminated messages are not redelivered")
	require.Equal(t, contract.Succeeded, b.nextOutcome(t).Event)
	b.noOutcome(t)
}

func TestConcurrencyIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var running, peak atomic.Int32
	release := make(chan struct{})
	b.newWorker(t, worker.Config{Concurrency: 2}, map[string]worker.Handler{
		"batch": func(ctx context.Context, _ *worker.Job) error {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			defer running.Add(-1)
			<-release
			return nil
		},
	})
	for range 5 {
		b.enqueue(t, contract.JobData{JobType: "batch"})
	}
	require.Eventually(t, func() bool { return running.Load() == 2 }, wait, 5*time.Millisecond)
	info := b.consumerInfo(t, contract.StreamJobs, "worker-batch")
	require.Equal(t, 2, info.NumAckPending, "only as many jobs as slots are pulled")
	close(release)
	for range 5 {
		require.Equal(t, contract.Succeeded, b.nextOutcome(t).Event)
	}
	require.Equal(t, int32(2), peak.Load())
}

// Slow jobs keep their slots (past several ack waits) and nothing else:
// quick jobs of the same type run on the free slots meanwhile, and a type
// whose slots are all taken does not hold up another type.
func TestSlowJobsDoNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var slowRuns, quickDone, otherDone atomic.Int32
	b.newWorker(t, worker.Config{Concurrency: 3, AckWait: 300 * time.Millisecond}, map[string]worker.Handler{
		"work": func(ctx context.Context, job *worker.Job) error {
			if string(job.Payload) == `"slow"` {
				slowRuns.Add(1)
				<-release
				return nil
			}
			quickDone.Add(1)
			return nil
		},
		"other": func(ctx context.Context, _ *worker.Job) error {
			otherDone.Add(1)
			return nil
		},
	})
	slow := func(n int32) {
		b.enqueue(t, contract.JobData{JobType: "work", Payload: json.RawMessage(`"slow"`)})
		require.Eventually(t, func() bool { return slowRuns.Load() == n }, wait, 5*time.Millisecond)
	}
	// Two slow jobs hold two of the three "work" slots: the third runs
	// every quick job.
	slow(1)
	slow(2)
	for range 40 {
		b.enqueue(t, contract.JobData{JobType: "work", Payload: json.RawMessage(`"quick"`)})
	}
	require.Eventually(t, func() bool { return quickDone.Load() == 40 }, wait, 5*time.Millisecond,
		"quick jobs waited behind the slow ones: %d of 40 ran", quickDone.Load())
	// A third one takes the last "work" slot: "other" runs all the same.
	slow(3)
	for range 40 {
		b.enqueue(t, contract.JobData{JobType: "other"})
	}
	require.Eventually(t, func() bool { return otherDone.Load() == 40 }, wait, 5*time.Millisecond,
		"jobs of another type waited behind a saturated type: %d of 40 ran", otherDone.Load())
	// Let the slow jobs outlive a few ack waits before they end: only the
	// in-progress acks keep the broker from handing them out again.
	time.Sleep(4 * 300 * time.Millisecond)
	close(release)
	b.settled(t, contract.StreamJobs, "worker-work")
	require.Equal(t, int32(3), slowRuns.Load(), "a slow job was redelivered while it ran")
	require.Zero(t, b.consumerInfo(t, contract.StreamJobs, "worker-work").NumRedelivered)
}

func TestLongJobIsKeptAliveWithInProgressAcks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	b.newWorker(t, worker.Config{AckWait: 400 * time.Millisecond}, map[string]worker.Handler{
		"report": func(ctx context.Context, _ *worker.Job) error {
			calls.Add(1)
			select {
			case <-time.After(1500 * time.Millisecond): // several ack waits
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	b.enqueue(t, contract.JobData{JobType: "report"})
	require.Equal(t, contract.Succeeded, b.nextOutcome(t).Event)
	b.settled(t, contract.StreamJobs, "worker-report")
	require.Equal(t, int32(1), calls.Load(), "the broker redelivered a job that was still running")
	require.Zero(t, b.consumerInfo(t, contract.StreamJobs, "worker-report").NumRedelivered)
}

// effects records external effects keyed by idempotency key, as a handler
// writing to a database with a unique key would.
type effects struct {
	mu   sync.Mutex
	keys map[string]int
}

func (e *effects) apply(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.keys == nil {
		e.keys = map[string]int{}
	}
	e.keys[key]++
}

func (e *effects) count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keys[key]
}

func TestGracefulStopFinishesRunningJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{})
	release := make(chan struct{})
	w := b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"sync": func(context.Context, *worker.Job) error {
			close(started)
			<-release
			return nil
		},
	})
	b.enqueue(t, contract.JobData{JobType: "sync"})
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(context.Background()) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a handler was running")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, contract.Succeeded, b.nextOutcome(t).Event)
	b.settled(t, contract.StreamJobs, "worker-sync")
	require.NoError(t, w.Stop(context.Background()), "Stop is idempotent")
	require.ErrorIs(t, w.Handle("late", func(context.Context, *worker.Job) error { return nil }), worker.ErrStarted)
}

func TestForcedStopHandsJobToAnotherWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fx effects
	started := make(chan struct{}, 1)
	first := b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"charge": func(ctx context.Context, job *worker.Job) error {
			started <- struct{}{}
			<-ctx.Done() // never finishes on its own
			return ctx.Err()
		},
	})
	id := b.enqueue(t, contract.JobData{JobType: "charge"})
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, first.Stop(ctx), context.DeadlineExceeded)

	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"charge": func(_ context.Context, job *worker.Job) error {
			fx.apply(job.IdempotencyKey())
			return nil
		},
	})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Succeeded, ev.Event, "the interrupted worker must not report an outcome")
	require.Equal(t, id, ev.ID)
	b.settled(t, contract.StreamJobs, "worker-charge")
	require.Equal(t, 1, fx.count(id+":1"))
	b.noOutcome(t)
}

func TestCrashedWorkerJobIsRedeliveredAndAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srvURL := b.nc.ConnectedUrl()
	var fx effects
	reached := make(chan struct{})
	// The first worker applies the effect and dies before reporting: its
	// connection goes away, as with kill -9.
	crashConn, err := nats.Connect(srvURL)
	require.NoError(t, err)
	crashJS, err := jetstream.New(crashConn)
	require.NoError(t, err)
	var once sync.Once
	b.newWorker(t, worker.Config{JS: crashJS, AckWait: 500 * time.Millisecond, DisableDueRouter: true}, map[string]worker.Handler{
		"charge": func(_ context.Context, job *worker.Job) error {
			fx.apply(job.IdempotencyKey())
			crashConn.Close()
			once.Do(func() { close(reached) })
			// Whatever it returns cannot be reported any more.
			return errors.New("worker died")
		},
	})
	id := b.enqueue(t, contract.JobData{JobType: "charge"})
	<-reached

	var runs atomic.Int32
	b.newWorker(t, worker.Config{AckWait: 500 * time.Millisecond}, map[string]worker.Handler{
		"charge": func(_ context.Context, job *worker.Job) error {
			runs.Add(1)
			fx.apply(job.IdempotencyKey())
			return nil
		},
	})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Succeeded, ev.Event)
	require.Equal(t, id, ev.ID)
	require.Equal(t, 1, ev.Succeeded.Attempt)
	b.settled(t, contract.StreamJobs, "worker-charge")
	require.Equal(t, int32(1), runs.Load())
	// Both runs share the key: a unique index on it records one effect.
	require.Equal(t, 2, fx.count(id+":1"))
	b.noOutcome(t)
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id, err := worker.Enqueue(ctx, b.js, contract.JobData{ID: "fixed-1", JobType: "email"})
	require.NoError(t, err)
	require.Equal(t, "fixed-1", id)
	_, err = worker.Enqueue(ctx, b.js, contract.JobData{ID: "fixed-1", JobType: "email"})
	require.NoError(t, err)
	s, err := b.js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "same id enqueued twice is stored once")

	_, err = worker.Enqueue(ctx, b.js, contract.JobData{JobType: "email", Attempt: 2})
	require.ErrorIs(t, err, contract.ErrInvalid)
	_, err = worker.Enqueue(ctx, b.js, contract.JobData{JobType: "Email"})
	require.ErrorIs(t, err, contract.ErrInvalid)
	generated, err := worker.Enqueue(ctx, b.js, contract.JobData{JobType: "email"})
	require.NoError(t, err)
	require.Len(t, generated, 26)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		cfg  worker.Config
		want string
	}{
		{worker.Config{}, "Config.JS is required"},
		{worker.Config{JS: b.js, Concurrency: -1}, "Config.Concurrency"},
		{worker.Config{JS: b.js, Concurrency: 4, MaxAckPending: 2}, "Config.MaxAckPending"},
		{worker.Config{JS: b.js, AckWait: time.Millisecond}, "Config.AckWait"},
		{worker.Config{JS: b.js, Timeout: -time.Second}, "Config.Timeout"},
		{worker.Config{JS: b.js, RepublishAfter: -time.Second}, "Config.RepublishAfter"},
		{worker.Config{JS: b.js, PendingLimit: -2}, "Config.PendingLimit"},
		{worker.Config{JS: b.js, ExecutorID: strings.Repeat("w", contract.MaxTokenLen+1)}, "Config.ExecutorID"},
		{worker.Config{JS: b.js, ExecutorID: "host\n1"}, "Config.ExecutorID"},
	} {
		_, err := worker.New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	w, err := worker.New(worker.Config{JS: b.js, DisableDueRouter: true})
	require.NoError(t, err)
	require.ErrorContains(t, w.Handle("Bad.Type", func(context.Context, *worker.Job) error { return nil }), "jobType")
	require.ErrorContains(t, w.Handle("ok", nil), "nil")
	require.ErrorContains(t, w.Start(context.Background()), "nothing to run")
}

// metric returns the value of a counter with the given label values (in
// label name order).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			match := true
			for i, l := range m.GetLabel() {
				match = match && l.GetValue() == labels[i]
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestCheckpointTooLargeToReportKeepsThePreviousOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"big": func(_ context.Context, job *worker.Job) error {
			big := strings.Repeat("c", 524_200)
			if err := job.SetCheckpoint(map[string]string{"step": "two", "blob": big}); err != nil {
				return err
			}
			return errors.New("temporarily unavailable")
		},
	})
	payload, err := json.Marshal(map[string]string{"blob": strings.Repeat("p", 524_200)})
	require.NoError(t, err)
	publishDue(t, b.js, contract.DueData{Kind: contract.KindJob, ID: "big-1", Attempt: 2, NextAttemptAt: time.Now(), JobType: "big",
		Payload: payload, Checkpoint: json.RawMessage(`{"step":"one"}`)})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Failed, ev.Event)
	require.JSONEq(t, `{"step":"one"}`, string(ev.Failed.Checkpoint))
	require.True(t, bytes.Equal(payload, ev.Failed.Payload), "payload changed")
	require.Equal(t, "temporary", ev.Failed.Error.Class)
}

// A consumer deleted under a running worker (an operator's `nats consumer
// rm`, a stream restored from backup) is recreated by the worker, which
// goes on running jobs and routing dues without a restart. The new
// consumers deliver their streams from the start; what already has an
// outcome is acked without running again.
func TestDeletedConsumersAreRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runs := map[string]int{}
	var mu sync.Mutex
	// An ack in flight while the consumer is deleted and created again
	// may not count for the new one (seen here about once in eight runs):
	// the message then comes back after AckWait and is recognised as
	// done. A short AckWait keeps that within the test's wait.
	b.newWorker(t, worker.Config{AckWait: 2 * time.Second}, map[string]worker.Handler{
		"report": func(_ context.Context, job *worker.Job) error {
			mu.Lock()
			defer mu.Unlock()
			runs[job.IdempotencyKey()]++
			return nil
		},
	})
	first := b.enqueue(t, contract.JobData{JobType: "report"})
	require.Equal(t, contract.Succeeded, b.nextOutcome(t).Event)
	publishDue(t, b.js, contract.DueData{Kind: contract.KindJob, ID: "due-before", Attempt: 2, JobType: "report"})
	require.Equal(t, "due-before", b.nextOutcome(t).ID)

	ctx := context.Background()
	require.NoError(t, b.js.DeleteConsumer(ctx, contract.StreamJobs, worker.ConsumerName("report")))
	require.NoError(t, b.js.DeleteConsumer(ctx, contract.StreamRetries, worker.DueRouterDurable))

	second := b.enqueue(t, contract.JobData{JobType: "report"})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Succeeded, ev.Event, "the job consumer came back")
	require.Equal(t, second, ev.ID, "the replayed first job did not report again")
	publishDue(t, b.js, contract.DueData{Kind: contract.KindJob, ID: "due-after", Attempt: 2, JobType: "report"})
	ev = b.nextOutcome(t)
	require.Equal(t, "due-after", ev.ID, "the due router came back")
	b.settled(t, contract.StreamJobs, worker.ConsumerName("report"))
	b.settled(t, contract.StreamRetries, worker.DueRouterDurable)
	b.noOutcome(t)
	// Polled, not read once: the worker publishes an outcome before it
	// acks the job, so the ack of the job the due became can still be in
	// flight when the test deletes the consumer. It then reaches the new
	// consumer of the same name and settles the replayed copy while the
	// worker is still checking that copy for an outcome (one loaded run in
	// five read 2 here).
	require.Eventually(t, func() bool {
		return metric(t, b.reg, "retryd_worker_replay_skipped_total") >= 3
	}, wait, 10*time.Millisecond,
		"replayed: the first job, the due routed before, and the job it became (again if redelivered)")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{first + ":1": 1, "due-before:2": 1, second + ":1": 1, "due-after:2": 1}, runs, "each attempt ran once")
	require.Equal(t, float64(2), metric(t, b.reg, "retryd_worker_consumers_recreated_total"))
}
