package scheduler_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

// A failing item goes through the whole backoff schedule: 100, 200, then
// 300 ms (capped), each due bringing back the latest checkpoint, and is
// exhausted when max_retries (3) are used.
func TestBackoffScheduleUntilExhausted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "bt", "", 3, 100, 300)

	fd := failed("bt", "item1", 1, "timeout")
	fd.Payload = json.RawMessage(`{"order":42}`)
	fd.Checkpoint = json.RawMessage(`{"step":"a"}`)
	fd.Source = "crm"
	b.publish(t, contract.Failed, fd)

	wantDelays := []int64{100, 200, 300}
	for attempt := 2; attempt <= 4; attempt++ {
		row := b.waitRow(t, "bt", "item1", inState(retrystore.StateDue, attempt))
		require.Equal(t, attempt-1, row.RetryCount)
		require.Equal(t, "crm", row.Source)
		h := b.history(t, "bt", "item1")
		sched := h[len(h)-2]
		require.Equal(t, attempt, sched.Attempt)
		require.Equal(t, wantDelays[attempt-2], *sched.DelayMS)
		require.Equal(t, contract.DecidedByBackoff, sched.DecidedBy)
		require.Equal(t, "bt-policy", sched.PolicyName)
		require.Equal(t, time.Duration(wantDelays[attempt-2])*time.Millisecond, sched.NextAttemptAt.Sub(sched.At),
			"next attempt = decision time (database clock) + delay")
		require.Equal(t, "due", h[len(h)-1].Event)

		dues := b.streamMsgs(t, contract.RetrySubject("bt", contract.Due, "item1"))
		require.Len(t, dues, attempt-1)
		last := dues[len(dues)-1]
		require.Equal(t, contract.DueMsgID("bt", "item1", attempt), last.Headers().Get(contract.HeaderMsgID))
		dd := decodeDue(t, last)
		require.JSONEq(t, `{"order":42}`, string(dd.Payload))
		require.JSONEq(t, `{"step":"`+string(rune('a'+attempt-2))+`"}`, string(dd.Checkpoint))

		next := failed("bt", "item1", attempt, "timeout")
		next.Checkpoint = json.RawMessage(`{"step":"` + string(rune('a'+attempt-1)) + `"}`)
		b.publish(t, contract.Failed, next)
	}
	row := b.waitRow(t, "bt", "item1", inState(retrystore.StateExhausted, 4))
	require.Equal(t, contract.ExhaustedMaxRetries, row.ExhaustedReason)
	require.Equal(t, 3, row.RetryCount)
	require.NotNil(t, row.ResolvedAt)
	require.Equal(t, []string{
		"failed:1", "scheduled:2", "due:2", "failed:2", "rescheduled:3", "due:3",
		"failed:3", "rescheduled:4", "due:4", "failed:4", "exhausted:4",
	}, events(b.history(t, "bt", "item1")))

	require.Eventually(t, func() bool {
		return len(b.streamMsgs(t, contract.RetrySubject("bt", contract.Exhausted, "item1"))) == 1
	}, waitFor, 10*time.Millisecond)
	ex := b.streamMsgs(t, contract.RetrySubject("bt", contract.Exhausted, "item1"))[0]
	require.Equal(t, "bt-exhausted:item1:4", ex.Headers().Get(contract.HeaderMsgID))
	require.Len(t, b.streamMsgs(t, contract.RetrySubject("bt", contract.Scheduled, "item1")), 1)
	require.Len(t, b.streamMsgs(t, contract.RetrySubject("bt", contract.Rescheduled, "item1")), 2)

	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_scheduled_total", "kind", "bt"))
	require.Equal(t, 2.0, metric(t, s.reg, "retryd_scheduler_rescheduled_total", "kind", "bt"))
	require.Equal(t, 3.0, metric(t, s.reg, "retryd_scheduler_due_total", "kind", "bt"))
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_exhausted_total", "kind", "bt"))
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_exhausted_by_class_total", "kind", "bt", "class", "timeout", "reason", "max_retries"))
	require.Equal(t, 3.0, metric(t, s.reg, "retryd_scheduler_due_lateness_seconds"))
}

// Each decision records what decided it: classes, hints, throttling,
// disabled retries and job-level overrides.
func TestDecisionReasons(t *testing.T) {
	t.Parallel()
	b := setup(t)
	classifier, err := errclass.NewClassifier(map[errclass.Class][]string{errclass.Validation: {"schema mismatch"}})
	require.NoError(t, err)
	s := b.start(t, func(c *scheduler.Config) { c.Classifier = classifier })
	b.policy(t, "dr", "", 2, hourMS, 2*hourMS)
	b.policy(t, "dr", "strict", 0, hourMS, 2*hourMS)
	b.policy(t, "dr-off", "", 5, hourMS, 2*hourMS, func(p *policy.Policy) { p.Enabled = false })
	zero, five, off := 0, 5, false

	type want struct {
		state     retrystore.State
		reason    string // exhausted reason
		decidedBy string
		delayMS   int64
		class     string
		attempt   int
	}
	cases := []struct {
		name string
		fd   contract.FailedData
		want want
	}{
		{"retryable class uses backoff", failed("dr", "timeout", 1, "timeout"),
			want{retrystore.StateScheduled, "", contract.DecidedByBackoff, hourMS, "timeout", 2}},
		{"non-retryable class", failed("dr", "validation", 1, "validation"),
			want{retrystore.StateExhausted, contract.ExhaustedNonRetryable, "", 0, "validation", 1}},
		{"alias of a class", failed("dr", "alias", 1, "validation_error"),
			want{retrystore.StateExhausted, contract.ExhaustedNonRetryable, "", 0, "validation", 1}},
		{"message classified by the configured patterns", contract.FailedData{Kind: "dr", ID: "pattern", Attempt: 1,
			Error: contract.ErrorInfo{Message: "upstream said: schema mismatch in field x"}},
			want{retrystore.StateExhausted, contract.ExhaustedNonRetryable, "", 0, "validation", 1}},
		{"owner marks a retryable class non-retryable", contract.FailedData{Kind: "dr", ID: "final", Attempt: 1,
			Error: contract.ErrorInfo{Class: "timeout", NonRetryable: true}},
			want{retrystore.StateExhausted, contract.ExhaustedNonRetryable, "", 0, "timeout", 1}},
		{"unknown errors are retried", contract.FailedData{Kind: "dr", ID: "unknown", Attempt: 1,
			Error: contract.ErrorInfo{Message: "something odd"}},
			want{retrystore.StateScheduled, "", contract.DecidedByBackoff, hourMS, "unknown", 2}},
		{"retry-after hint above the max delay is honoured", contract.FailedData{Kind: "dr", ID: "hint", Attempt: 1,
			Error: contract.ErrorInfo{Class: "rate_limit"}, RetryAfter: contract.RetryAfterDuration(3 * time.Hour)},
			want{retrystore.StateScheduled, "", contract.DecidedByRetryAfter, 3 * hourMS, "rate_limit", 2}},
		{"retry-after hint capped at max_retry_after", contract.FailedData{Kind: "dr", ID: "hint-cap", Attempt: 1,
			Error: contract.ErrorInfo{Class: "rate_limit"}, RetryAfter: contract.RetryAfterDuration(30 * time.Hour)},
			want{retrystore.StateScheduled, "", contract.DecidedByRetryAfter, 24 * hourMS, "rate_limit", 2}},
		// An owner not upgraded to held events: its throttle is a hold.
		{"throttled by the owner", contract.FailedData{Kind: "dr", ID: "throttle", Attempt: 1, Reason: "source_throttled",
			Error: contract.ErrorInfo{Class: "rate_limit"}, RetryAfter: contract.RetryAfterDuration(30 * time.Second)},
			want{retrystore.StateScheduled, "", contract.DecidedByHold, 30_000, "", 2}},
		{"retries disabled by the job", contract.FailedData{Kind: "dr", ID: "job-off", Attempt: 1, RetryEnabled: &off,
			Error: contract.ErrorInfo{Class: "timeout"}},
			want{retrystore.StateExhausted, contract.ExhaustedRetriesDisabled, "", 0, "timeout", 1}},
		{"retries disabled by the policy", failed("dr-off", "policy-off", 1, "timeout"),
			want{retrystore.StateExhausted, contract.ExhaustedRetriesDisabled, "", 0, "timeout", 1}},
		{"job max_retries override 0", contract.FailedData{Kind: "dr", ID: "max0", Attempt: 1, MaxRetries: &zero,
			Error: contract.ErrorInfo{Class: "timeout"}},
			want{retrystore.StateExhausted, contract.ExhaustedMaxRetries, "", 0, "timeout", 1}},
		{"job max_retries override above the policy", contract.FailedData{Kind: "dr", ID: "max5", Attempt: 4, MaxRetries: &five,
			Error: contract.ErrorInfo{Class: "timeout"}},
			want{retrystore.StateScheduled, "", contract.DecidedByBackoff, 2 * hourMS, "timeout", 5}},
		{"policy budget without override", failed("dr", "budget", 4, "timeout"),
			want{retrystore.StateExhausted, contract.ExhaustedMaxRetries, "", 0, "timeout", 4}},
		{"job type policy", contract.FailedData{Kind: "dr", ID: "strict", Attempt: 1, JobType: "strict",
			Error: contract.ErrorInfo{Class: "timeout"}},
			want{retrystore.StateExhausted, contract.ExhaustedMaxRetries, "", 0, "timeout", 1}},
	}
	for _, c := range cases {
		b.publish(t, contract.Failed, c.fd)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			row := b.waitRow(t, c.fd.Kind, c.fd.ID, func(r retrystore.Retry) bool { return r.PolicyName != "" })
			require.Equal(t, c.want.state, row.State)
			require.Equal(t, c.want.attempt, row.Attempt)
			require.Equal(t, c.want.reason, row.ExhaustedReason)
			require.Equal(t, c.want.class, row.LastErrorClass)
			h := b.history(t, c.fd.Kind, c.fd.ID)
			require.Len(t, h, 2)
			require.Equal(t, c.want.class, h[0].ErrorClass)
			decision := h[1]
			if c.want.state == retrystore.StateScheduled {
				require.Equal(t, c.want.decidedBy, decision.DecidedBy)
				if c.want.decidedBy == contract.DecidedByHold {
					// A hold lasts until the owner's time, counted from
					// when it held the item, not from the decision.
					require.InDelta(t, c.want.delayMS, *decision.DelayMS, 1000)
				} else {
					require.Equal(t, c.want.delayMS, *decision.DelayMS)
				}
				require.Equal(t, c.want.class, decision.ErrorClass)
				var d contract.Decision
				require.NoError(t, json.Unmarshal(decision.Detail, &d))
				require.Equal(t, decision.PolicyName, d.Policy)
			} else {
				require.Equal(t, "exhausted", decision.Event)
				require.Contains(t, string(decision.Detail), c.want.reason)
			}
		})
	}
	row, err := retrystore.Get(b.ctx, b.pool, "dr", "max5")
	require.NoError(t, err)
	require.Equal(t, 5, row.MaxRetries)
	require.Equal(t, 5, *row.MaxRetriesOverride)
	h := b.history(t, "dr", "hint")
	require.NotContains(t, string(h[1].Detail), "capped")
	h = b.history(t, "dr", "hint-cap")
	require.Contains(t, string(h[1].Detail), `"capped_by": "max_retry_after"`)
	require.Equal(t, 8.0, metric(t, s.reg, "retryd_scheduler_exhausted_total", "kind", "dr"))
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_exhausted_total", "kind", "dr-off"))
	require.Equal(t, 5.0, metric(t, s.reg, "retryd_scheduler_scheduled_total", "kind", "dr"))
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_rescheduled_total", "kind", "dr"))
}

// An owner's success closes the item; facts about an attempt the row moved
// past are stale; a success of an item that never failed needs no row.
func TestSucceededClosesAndStaleFactsAreIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "ok", "", 3, 20, 100)

	b.failTo(t, "ok", "a", 1, "network", retrystore.StateDue)
	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "ok", ID: "a", Attempt: 2})
	row := b.waitRow(t, "ok", "a", inState(retrystore.StateSucceeded, 2))
	require.NotNil(t, row.ResolvedAt)

	// A late failure of the attempt that succeeded, and a replay of the
	// first failure under another message id (so neither JetStream nor
	// the inbox knows it): the state guards make both stale.
	b.publish(t, contract.Failed, failed("ok", "a", 2, "network"))
	replay := withEnvelopeID(t, lifecycleMsg(t, contract.Failed, failed("ok", "a", 1, "timeout")), "owner-own-id-1")
	_, err := b.js.PublishMsg(b.ctx, replay)
	require.NoError(t, err)
	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "ok", ID: "never-failed", Attempt: 1})
	waitMetric(t, s.reg, 2, "retryd_scheduler_stale_total", "kind", "ok", "event", "failed")
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "succeeded:2"}, events(b.history(t, "ok", "a")))
	_, err = retrystore.Get(b.ctx, b.pool, "ok", "never-failed")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_succeeded_total", "kind", "ok"))
}

// Malformed messages are terminated with a reason and counted; the
// consumer goes on with the next message.
func TestMalformedMessagesAreTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)

	good := lifecycleMsg(t, contract.Failed, failed("mal", "ok", 1, "timeout"))
	bad := [][2]string{
		{"retry.mal.failed.x1", `not json`},
		{"retry.mal.failed.x2", `{"specversion":"1.0","id":"a","source":"s","type":"retry.failed","time":"2024-01-01T00:00:00Z","data":{"kind":"mal","id":"x2","attempt":1,"error":{"message":"m"},"extra":true}}`},
		{"retry.mal.failed.x3", `{"specversion":"1.0","id":"a","source":"s","type":"retry.failed","time":"2024-01-01T00:00:00Z","data":{"kind":"mal","id":"other","attempt":1,"error":{"message":"m"}}}`},
		{"retry.mal.succeeded.x4", `{"specversion":"1.0","id":"a","source":"s","type":"retry.failed","time":"2024-01-01T00:00:00Z","data":{}}`},
		{"retry.mal.failed.x5", `{"specversion":"1.0","id":"a","source":"s","type":"retry.failed","time":"2024-01-01T00:00:00Z","data":{"kind":"mal","id":"x5","attempt":0,"error":{"message":"m"}}}`},
	}
	for _, m := range bad {
		_, err := b.js.Publish(b.ctx, m[0], []byte(m[1]))
		require.NoError(t, err)
	}
	_, err := b.js.PublishMsg(b.ctx, good)
	require.NoError(t, err)

	b.waitRow(t, "mal", "ok", func(r retrystore.Retry) bool { return r.State == retrystore.StateScheduled })
	waitMetric(t, s.reg, float64(len(bad)), "retryd_scheduler_malformed_total", "consumer", "scheduler")
	page, err := retrystore.List(b.ctx, b.pool, retrystore.ListFilter{Kind: "mal"})
	require.NoError(t, err)
	require.Len(t, page.Retries, 1)

	// Terminated messages are not redelivered: nothing is pending on the
	// consumer.
	require.Eventually(t, func() bool {
		return natstest.Settled(t, b.ctx, b.js, contract.StreamRetries, scheduler.ConsumerName)
	}, waitFor, 20*time.Millisecond)
}

// ensureStreams creates the streams (in memory) before any scheduler runs, so
// that facts published now wait there for one.
func (b *bundle) ensureStreams(t *testing.T) {
	t.Helper()
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Storage: jetstream.MemoryStorage}))
}

// Several facts of one item in one policy-stage batch (published while no
// scheduler ran, fetched together) apply in stream order, each seeing
// the change before it.
func TestFactsOfOneItemInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "same", "", 3, 60_000, 60_000)
	b.ensureStreams(t)
	b.publish(t, contract.Failed, failed("same", "x", 1, "timeout"))
	b.publish(t, contract.Cancelled, contract.CancelledData{Kind: "same", ID: "x", Attempt: 2, By: "owner"})
	b.publish(t, contract.Failed, failed("same", "y", 1, "timeout"))
	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "same", ID: "y", Attempt: 2})
	b.publish(t, contract.Failed, failed("same", "z", 1, "timeout"))
	s := b.start(t)

	x := b.waitRow(t, "same", "x", func(r retrystore.Retry) bool { return r.State == retrystore.StateCancelled })
	require.Equal(t, 2, x.Attempt)
	require.Equal(t, []string{"failed:1", "scheduled:2", "cancelled:2"}, events(b.history(t, "same", "x")))
	b.waitRow(t, "same", "y", func(r retrystore.Retry) bool { return r.State == retrystore.StateSucceeded })
	require.Equal(t, []string{"failed:1", "scheduled:2", "succeeded:2"}, events(b.history(t, "same", "y")))
	b.waitRow(t, "same", "z", inState(retrystore.StateScheduled, 2))
	// Counted after the commit the rows already show.
	waitMetric(t, s.reg, 3, "retryd_scheduler_scheduled_total", "kind", "same")
}

// The same fact twice in one policy-stage batch (republished past the
// duplicate window, so JetStream stores it twice): the second copy
// changes nothing and counts as a duplicate.
func TestDuplicateInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "twice", "", 3, 60_000, 60_000)
	b.ensureStreams(t)
	shrinkDuplicateWindow(t, b, time.Second)
	msg := lifecycleMsg(t, contract.Failed, failed("twice", "x", 1, "timeout"))
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	b.storeAgain(t, msg)
	s := b.start(t)

	b.waitRow(t, "twice", "x", inState(retrystore.StateScheduled, 2))
	waitMetric(t, s.reg, 1, "retryd_scheduler_duplicate_total", "consumer", scheduler.Owner)
	require.Equal(t, []string{"failed:1", "scheduled:2"}, events(b.history(t, "twice", "x")))
	require.Equal(t, float64(1), metric(t, s.reg, "retryd_scheduler_scheduled_total", "kind", "twice"))
}

// A fact the database refuses for good (here a check constraint the test
// adds) is terminated and counted, alone: the other facts of its batch are
// applied, and it does not come back to fail later batches.
func TestPoisonFactIsTerminatedAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "poison", "", 3, 60_000, 60_000)
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE retries ADD CONSTRAINT test_poison CHECK (item_id <> 'bad')`)
	require.NoError(t, err)
	b.ensureStreams(t)
	ids := []string{"a", "b", "bad", "c", "d"}
	for _, id := range ids {
		_, err := b.js.PublishMsg(b.ctx, lifecycleMsg(t, contract.Failed, failed("poison", id, 1, "timeout")))
		require.NoError(t, err)
	}
	s := b.start(t)
	for _, id := range ids {
		if id != "bad" {
			b.waitRow(t, "poison", id, inState(retrystore.StateScheduled, 2))
		}
	}
	waitMetric(t, s.reg, 1, "retryd_scheduler_malformed_total", "consumer", scheduler.Owner)
	require.Eventually(t, func() bool {
		return natstest.Settled(t, b.ctx, b.js, contract.StreamRetries, scheduler.ConsumerName)
	}, waitFor, 10*time.Millisecond, "the poison fact was not terminated")
	require.Equal(t, 4, pgtest.Count(t, b.pool, `SELECT count(*) FROM retries WHERE kind = 'poison'`))
}
