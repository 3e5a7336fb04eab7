package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/pkg/worker"
)

// A hold publishes exactly one held fact, with what a failure would carry
// back on the due (payload, checkpoint, metadata with the overrides), and
// no failure; the job is acked. Fed to the retry policy as the scheduler
// does, it uses no retry and is not capped by the backoff's max delay.
func TestHoldPublishesHeldNotFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	b.newWorker(t, worker.Config{Now: func() time.Time { return now }}, map[string]worker.Handler{
		"sync_tenant": func(_ context.Context, job *worker.Job) error {
			if err := job.SetCheckpoint(map[string]string{"step": "fetch"}); err != nil {
				return err
			}
			return worker.Hold(90*time.Minute, "tenant t1 is at its cap of 5 syncs", worker.WithHoldKey("tenant-t1"))
		},
	})
	id := b.enqueueWithOverrides(t, "sync_tenant", `{"tenant":"t1"}`, 3)

	ev := b.nextOutcome(t)
	require.Equal(t, contract.Held, ev.Event)
	require.Equal(t, contract.LifecycleMsgID(contract.KindJob, contract.Held, id, 1), ev.Envelope.ID)
	require.Equal(t, "job-held:"+id+":1", ev.Envelope.ID)
	h := ev.Held
	require.NotNil(t, h)
	require.Equal(t, contract.KindJob, h.Kind)
	require.Equal(t, id, h.ID)
	require.Equal(t, 1, h.Attempt, "the attempt that was held")
	require.Equal(t, contract.HoldThrottle, h.Reason)
	require.NotNil(t, h.Until)
	require.True(t, now.Add(90*time.Minute).Equal(*h.Until), "until is now+after: %s", h.Until)
	require.Equal(t, "tenant-t1", h.HoldKey)
	require.Equal(t, "tenant t1 is at its cap of 5 syncs", h.Detail)
	require.Equal(t, "sync_tenant", h.JobType)
	require.JSONEq(t, `{"tenant":"t1"}`, string(h.Payload))
	require.JSONEq(t, `{"step":"fetch"}`, string(h.Checkpoint))
	require.Equal(t, map[string]string{"tenant": "t1"}, h.Metadata)
	require.Equal(t, 3, *h.MaxRetries, "the overrides come back on the due, as after a failure")
	require.True(t, *h.RetryEnabled)
	require.EqualValues(t, 60_000, h.TimeoutMS)
	b.settled(t, contract.StreamJobs, worker.ConsumerName("sync_tenant"))
	b.noOutcome(t)
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_attempts_total", "sync_tenant", "held"))
	require.Zero(t, metric(t, b.reg, "retryd_worker_attempts_total", "sync_tenant", "failed"))

	// What the scheduler decides for it: the retry count the job had
	// (2 here) stays, and the 90 minutes are not cut to the 5 minute max
	// delay of the policy's backoff.
	p := policy.Policy{Kind: contract.KindJob, Name: "sync", Version: 1, MaxRetries: 3, Backoff: backoff.Default(), Enabled: true}
	out := policy.Decide(p, policy.Input{
		Attempt: h.Attempt, RetryCount: 2, FailedAt: ev.Envelope.Time,
		Hold: &policy.Hold{Reason: h.Reason, Until: *h.Until},
	}, nil)
	require.True(t, out.Retry)
	require.Equal(t, 2, out.Decision.RetryCount, "a hold uses no retry")
	require.Equal(t, 2, out.NextAttempt)
	require.True(t, h.Until.Equal(out.NextAttemptAt), "due at until, uncapped: %s", out.NextAttemptAt)
	require.Equal(t, contract.DecidedByHold, out.Decision.DecidedBy)
}

// Reasons, wrapped holds and a hold returned as the timeout ran out all
// become a held fact the strict decoder accepts.
func TestHoldVariants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.newWorker(t, worker.Config{Grace: time.Second}, map[string]worker.Handler{
		"capped": func(context.Context, *worker.Job) error {
			return fmt.Errorf("tenant busy: %w", worker.Hold(time.Second, "", worker.WithHoldReason(contract.HoldConcurrency)))
		},
		"window": func(context.Context, *worker.Job) error {
			return worker.Hold(worker.MaxHoldAfter, "maintenance window", worker.WithHoldReason(contract.HoldPause))
		},
		"late": func(ctx context.Context, _ *worker.Job) error {
			<-ctx.Done()
			return worker.Hold(time.Minute, "gave up waiting for a slot")
		},
		"classified": func(context.Context, *worker.Job) error {
			// A hold wins over the class of the error wrapping it.
			return errclass.NonRetryable(worker.Hold(time.Minute, "not now"))
		},
	})
	for _, tc := range []struct {
		typ, reason string
		timeout     int64
	}{
		{typ: "capped", reason: contract.HoldConcurrency},
		{typ: "window", reason: contract.HoldPause},
		{typ: "late", reason: contract.HoldThrottle, timeout: 50},
		{typ: "classified", reason: contract.HoldThrottle},
	} {
		id := b.enqueue(t, contract.JobData{JobType: tc.typ, TimeoutMS: tc.timeout})
		ev := b.nextOutcome(t)
		require.Equal(t, contract.Held, ev.Event, tc.typ)
		require.Equal(t, id, ev.ID, tc.typ)
		require.Equal(t, tc.reason, ev.Held.Reason, tc.typ)
		require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_attempts_total", tc.typ, "held"), tc.typ)
	}
	b.noOutcome(t)
}

// A detail longer than the limit is cut, at a character boundary, and
// bytes the scheduler could not store (NUL, invalid UTF-8) are replaced:
// the held fact must decode, or the hold would be lost.
func TestHoldDetailIsMadeStorable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := strings.Repeat("é", 3000) + "\x00tail" + string([]byte{0xff})
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"chatty": func(context.Context, *worker.Job) error { return worker.Hold(time.Minute, long) },
		"fails":  func(context.Context, *worker.Job) error { return errors.New("bad\x00byte " + string([]byte{0xfe})) },
	})
	b.enqueue(t, contract.JobData{JobType: "chatty"})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Held, ev.Event)
	d := ev.Held.Detail
	require.LessOrEqual(t, len(d), contract.MaxMessageLen)
	require.True(t, utf8.ValidString(d))
	require.NotContains(t, d, "\x00")
	require.True(t, strings.HasPrefix(d, "éé"))

	// The same rules keep a failure's message storable.
	b.enqueue(t, contract.JobData{JobType: "fails"})
	ev = b.nextOutcome(t)
	require.Equal(t, contract.Failed, ev.Event)
	require.Equal(t, "bad\uFFFDbyte \uFFFD", ev.Failed.Error.Message)
}

// Hold refuses what the scheduler could not honour with an error that
// says what is wrong; returned by a handler, such an error (or a
// HoldError built by hand with bad values) is a temporary failure, never
// a hold.
func TestHoldRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"zero", worker.Hold(0, "x"), "hold: after must be more than 0, got 0s"},
		{"negative", worker.Hold(-time.Second, "x"), "hold: after must be more than 0, got -1s"},
		{"huge", worker.Hold(worker.MaxHoldAfter+time.Nanosecond, "x"), "hold: after must be at most 8784h0m0s (366 days), got 8784h0m0.000000001s"},
		{"forever", worker.Hold(time.Duration(1<<63-1), "x"), "hold: after must be at most 8784h0m0s (366 days)"},
		{"key", worker.Hold(time.Second, "x", worker.WithHoldKey("tenant.1")), `hold: key "tenant.1" must use only letters, digits, '_' and '-'`},
		{"long key", worker.Hold(time.Second, "x", worker.WithHoldKey(strings.Repeat("k", 129))), "hold: key is 129 characters, more than the limit of 128"},
		{"reason", worker.Hold(time.Second, "x", worker.WithHoldReason("nap")), `hold: reason must be throttle, concurrency or pause, got "nap"`},
	} {
		require.ErrorIs(t, tc.err, contract.ErrInvalid, tc.name)
		require.ErrorContains(t, tc.err, tc.want, tc.name)
		_, held := worker.AsHold(tc.err)
		require.False(t, held, "%s: a bad hold is not a hold", tc.name)
		e, ok := errclass.As(tc.err)
		require.True(t, ok, tc.name)
		require.Equal(t, errclass.Temporary, e.Class, tc.name)
	}

	b := setup(t)
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"negative": func(context.Context, *worker.Job) error { return worker.Hold(-time.Minute, "") },
		"by_hand":  func(context.Context, *worker.Job) error { return &worker.HoldError{After: 400 * 24 * time.Hour} },
	})
	for typ, want := range map[string]string{
		"negative": "hold: after must be more than 0, got -1m0s",
		"by_hand":  "hold: after must be at most 8784h0m0s (366 days), got 9600h0m0s",
	} {
		b.enqueue(t, contract.JobData{JobType: typ})
		ev := b.nextOutcome(t)
		require.Equal(t, contract.Failed, ev.Event, typ)
		require.Equal(t, string(errclass.Temporary), ev.Failed.Error.Class, typ)
		require.Equal(t, want, ev.Failed.Error.Message, typ)
		require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_attempts_total", typ, "failed"), typ)
	}
	b.noOutcome(t)
}

// ackLosingJS publishes with another connection, then closes the
// worker's own one after the first held fact: the fact is stored, the
// job's ack is lost, and the broker redelivers the job, as after a crash
// between the publish and the ack.
type ackLosingJS struct {
	jetstream.JetStream
	publisher jetstream.JetStream
	conn      *nats.Conn
	once      sync.Once
}

func (j *ackLosingJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.publisher.PublishMsg(ctx, msg, opts...)
	if err == nil && strings.HasPrefix(msg.Subject, "retry.job.held.") {
		j.once.Do(j.conn.Close)
	}
	return ack, err
}

// A redelivered attempt that holds again, for a different time, is one
// hold: both facts have the id job-held:<id>:<attempt>, and JetStream
// stores the first only.
func TestRedeliveredHoldIsStoredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := nats.Connect(b.nc.ConnectedUrl())
	require.NoError(t, err)
	js, err := jetstream.New(conn)
	require.NoError(t, err)
	var runs atomic.Int32
	hold := func(_ context.Context, job *worker.Job) error {
		n := runs.Add(1)
		return worker.Hold(time.Duration(n)*time.Hour, fmt.Sprintf("run %d: not now", n))
	}
	b.newWorker(t, worker.Config{JS: &ackLosingJS{JetStream: js, publisher: b.js, conn: conn}, AckWait: 500 * time.Millisecond, DisableDueRouter: true},
		map[string]worker.Handler{"poll": hold})
	id := b.enqueue(t, contract.JobData{JobType: "poll"})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Held, ev.Event)
	require.Equal(t, "run 1: not now", ev.Held.Detail)

	b.newWorker(t, worker.Config{AckWait: 500 * time.Millisecond}, map[string]worker.Handler{"poll": hold})
	require.Eventually(t, func() bool { return runs.Load() == 2 }, wait, 10*time.Millisecond, "the job was not redelivered")
	b.settled(t, contract.StreamJobs, worker.ConsumerName("poll"))
	b.noOutcome(t)

	s, err := b.js.Stream(context.Background(), contract.StreamRetries)
	require.NoError(t, err)
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(contract.RetrySubject(contract.KindJob, contract.Held, id)))
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "one held fact for the attempt")
	last, err := s.GetLastMsgForSubject(context.Background(), contract.RetrySubject(contract.KindJob, contract.Held, id))
	require.NoError(t, err)
	require.Equal(t, "job-held:"+id+":1", last.Header.Get(contract.HeaderMsgID))
	require.Contains(t, string(last.Data), "run 1: not now")
}

// A held attempt is done: a consumer created again replays it and acks it
// without running the handler again.
func TestReplayedHeldJobIsNotRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	runs := map[string]int{}
	b.newWorker(t, worker.Config{AckWait: 2 * time.Second}, map[string]worker.Handler{
		"poll": func(_ context.Context, job *worker.Job) error {
			mu.Lock()
			runs[job.IdempotencyKey()]++
			mu.Unlock()
			if string(job.Payload) == `"hold"` {
				return worker.Hold(time.Hour, "not now")
			}
			return nil
		},
	})
	held := b.enqueue(t, contract.JobData{JobType: "poll", Payload: json.RawMessage(`"hold"`)})
	require.Equal(t, contract.Held, b.nextOutcome(t).Event)

	require.NoError(t, b.js.DeleteConsumer(context.Background(), contract.StreamJobs, worker.ConsumerName("poll")))
	next := b.enqueue(t, contract.JobData{JobType: "poll"})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Succeeded, ev.Event)
	require.Equal(t, next, ev.ID, "the replayed held job did not report again")
	b.settled(t, contract.StreamJobs, worker.ConsumerName("poll"))
	b.noOutcome(t)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{held + ":1": 1, next + ":1": 1}, runs)
}

// docExample returns the first ```text and ```json blocks of the section
// of docs/contract.md under heading.
func docExample(t *testing.T, heading string) (text, body string) {
	t.Helper()
	raw, err := os.ReadFile("../../../docs/contract.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	require.True(t, ok, "docs/contract.md has no %q", heading)
	section, _, _ = strings.Cut(section, "\n## ")
	block := func(lang string) string {
		_, rest, ok := strings.Cut(section, "```"+lang+"\n")
		require.True(t, ok, "no %s block under %q", lang, heading)
		b, _, ok := strings.Cut(rest, "```")
		require.True(t, ok)
		return b
	}
	return block("text"), block("json")
}

// The held message docs/contract.md shows workers in other languages is
// byte for byte what the SDK publishes: subject, headers and body.
func TestContractDocShowsTheHeldTheWorkerPublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	b.newWorker(t, worker.Config{Source: "billing-worker", ExecutorID: "billing-worker-7-4242", Now: func() time.Time { return now }}, map[string]worker.Handler{
		"email_campaign": func(_ context.Context, job *worker.Job) error {
			if err := job.SetCheckpoint(map[string]string{"last_node": "render"}); err != nil {
				return err
			}
			return worker.Hold(30*time.Minute, "mail provider: 429, retry after 1800 s", worker.WithHoldKey("mailprovider"))
		},
	})
	b.enqueue(t, contract.JobData{ID: "01JQ7Z3K5W8E4M2V6T0B9XN1CD", JobType: "email_campaign",
		Payload: json.RawMessage(`{"campaign_id":"cmp_42"}`), Metadata: map[string]string{"tenant": "t1"}})
	msg, err := b.outcomes.Next(jetstream.FetchMaxWait(wait))
	require.NoError(t, err)

	lines := []string{msg.Subject()}
	var headers []string
	for k, v := range msg.Headers() {
		headers = append(headers, k+": "+strings.Join(v, ","))
	}
	slices.Sort(headers)
	lines = append(lines, headers...)
	text, body := docExample(t, "### For workers in other languages")
	require.Equal(t, strings.Join(lines, "\n")+"\n", text)
	require.JSONEq(t, body, string(msg.Data()))
	var indented bytes.Buffer
	require.NoError(t, json.Indent(&indented, msg.Data(), "", "  "))
	require.Equal(t, indented.String()+"\n", body, "same fields in the same order")
	_, err = contract.DecodeLifecycle(msg.Subject(), []byte(body))
	require.NoError(t, err, "the example decodes strictly")
}
