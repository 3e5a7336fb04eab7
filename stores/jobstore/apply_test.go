package jobstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/pgdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	pool *pgxpool.Pool
	ctx  context.Context
	t0   time.Time
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{
		pool: pgtest.NewPool(t),
		ctx:  context.Background(),
		t0:   time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC),
	}
}

// step is one fact of a job's life: a job message or a lifecycle event.
type step struct {
	name string
	job  *contract.JobData
	ev   *contract.LifecycleEvent
	at   time.Time
}

func (b *bundle) apply(t *testing.T, s step) {
	t.Helper()
	if s.job != nil {
		require.NoError(t, jobstore.ApplyJob(b.ctx, b.pool, *s.job, s.at), s.name)
		return
	}
	require.NoError(t, jobstore.ApplyLifecycle(b.ctx, b.pool, *s.ev), s.name)
}

func (b *bundle) get(t *testing.T, id string) jobstore.Job {
	t.Helper()
	j, err := jobstore.Get(b.ctx, b.pool, id)
	require.NoError(t, err)
	return j
}

func jobMsg(id, typ string, attempt int, cp string, at time.Time) step {
	d := contract.JobData{ID: id, JobType: typ, Attempt: attempt}
	if cp != "" {
		d.Checkpoint = json.RawMessage(cp)
	}
	return step{name: fmt.Sprintf("job(%d)", attempt), job: &d, at: at}
}

func lifecycle(id string, ev contract.Lifecycle, at time.Time) contract.LifecycleEvent {
	return contract.LifecycleEvent{Kind: contract.KindJob, ID: id, Event: ev, Envelope: contract.Envelope{Time: at}}
}

func failed(id, typ string, attempt int, class, msg, cp string, at time.Time) step {
	ev := lifecycle(id, contract.Failed, at)
	ev.Failed = &contract.FailedData{Kind: contract.KindJob, ID: id, Attempt: attempt, JobType: typ,
		Error: contract.ErrorInfo{Class: class, Message: msg}}
	if cp != "" {
		ev.Failed.Checkpoint = json.RawMessage(cp)
	}
	return step{name: fmt.Sprintf("failed(%d)", attempt), ev: &ev}
}

func scheduled(id, typ string, attempt, retryCount, maxRetries int, next, at time.Time) step {
	e := contract.Rescheduled
	if attempt == 2 {
		e = contract.Scheduled
	}
	ev := lifecycle(id, e, at)
	ev.Scheduled = &contract.ScheduledData{Kind: contract.KindJob, ID: id, Attempt: attempt, JobType: typ, NextAttemptAt: next,
		Decision: contract.Decision{RetryCount: retryCount, MaxRetries: maxRetries, DecidedBy: contract.DecidedByBackoff}}
	return step{name: fmt.Sprintf("%s(%d)", e, attempt), ev: &ev}
}

func succeeded(id string, attempt int, at time.Time) step {
	ev := lifecycle(id, contract.Succeeded, at)
	ev.Succeeded = &contract.SucceededData{Kind: contract.KindJob, ID: id, Attempt: attempt}
	return step{name: fmt.Sprintf("succeeded(%d)", attempt), ev: &ev}
}

func exhausted(id, typ string, attempt int, reason, class, msg string, retryCount, maxRetries int, at time.Time) step {
	ev := lifecycle(id, contract.Exhausted, at)
	ev.Exhausted = &contract.ExhaustedData{Kind: contract.KindJob, ID: id, Attempt: attempt, JobType: typ, Reason: reason,
		Error: contract.ErrorInfo{Class: class, Message: msg}, RetryCount: retryCount, MaxRetries: maxRetries}
	return step{name: fmt.Sprintf("exhausted(%d)", attempt), ev: &ev}
}

func cancelled(id string, attempt int, at time.Time) step {
	ev := lifecycle(id, contract.Cancelled, at)
	ev.Cancelled = &contract.CancelledData{Kind: contract.KindJob, ID: id, Attempt: attempt, By: "ops", Reason: "customer left"}
	return step{name: fmt.Sprintf("cancelled(%d)", attempt), ev: &ev}
}

// twoTimeoutsThenSuccess is the life of a job that timed out twice and
// then worked, in the order the facts happen.
func (b *bundle) twoTimeoutsThenSuccess(id string) []step {
	at := func(s int) time.Time { return b.t0.Add(time.Duration(s) * time.Second) }
	return []step{
		jobMsg(id, "email_campaign", 1, "", at(0)),
		failed(id, "email_campaign", 1, "timeout", "timed out after 3000ms", `{"step":"render"}`, at(1)),
		scheduled(id, "email_campaign", 2, 1, 4, at(3), at(1)),
		jobMsg(id, "email_campaign", 2, `{"step":"render"}`, at(3)),
		failed(id, "email_campaign", 2, "timeout", "timed out after 3001ms", `{"step":"send","sent":1}`, at(4)),
		scheduled(id, "email_campaign", 3, 2, 4, at(8), at(4)),
		jobMsg(id, "email_campaign", 3, `{"step":"send","sent":1}`, at(8)),
		succeeded(id, 3, at(9)),
	}
}

func TestFoldFollowsTheSeedStatuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := []jobstore.Status{"in_progress", "in_progress", "retrying", "in_progress", "in_progress", "retrying", "in_progress", "completed"}
	for i, s := range b.twoTimeoutsThenSuccess("j1") {
		b.apply(t, s)
		require.Equal(t, want[i], b.get(t, "j1").Status, "after %s", s.name)
		if s.name == "rescheduled(3)" {
			j := b.get(t, "j1")
			require.Equal(t, b.t0.Add(8*time.Second), j.NextRetryAt.UTC())
			require.Equal(t, 2, j.RetryCount)
		}
	}
	j := b.get(t, "j1")
	require.Equal(t, "email_campaign", j.JobType)
	require.Equal(t, 3, j.Attempt)
	require.Equal(t, 2, j.RetryCount)
	require.Equal(t, 4, *j.MaxRetries)
	require.True(t, j.RetryEnabled)
	require.Equal(t, "send", j.CurrentStep)
	require.JSONEq(t, `{"step":"send","sent":1}`, string(j.Checkpoint))
	require.Equal(t, "timed out after 3001ms", j.LastErrorMessage)
	require.Equal(t, "timeout", j.LastErrorClass)
	require.Equal(t, b.t0.Add(4*time.Second), j.LastErrorTimestamp.UTC())
	require.Equal(t, b.t0.Add(8*time.Second), j.LastAttemptAt.UTC())
	require.Nil(t, j.NextRetryAt)
	require.Equal(t, b.t0, j.CreatedAt.UTC())
	require.Equal(t, b.t0.Add(9*time.Second), j.CompletedAt.UTC())
}

func TestFoldIsIndependentOfOrderAndDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, s := range b.twoTimeoutsThenSuccess("in-order") {
		b.apply(t, s)
	}
	want := b.get(t, "in-order")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 40 {
		id := fmt.Sprintf("shuffled-%d", i)
		steps := b.twoTimeoutsThenSuccess(id)
		// Each fact may also arrive twice (redelivery past the inbox).
		steps = append(steps, steps[rng.IntN(len(steps))], steps[rng.IntN(len(steps))])
		rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
		order := ""
		for _, s := range steps {
			b.apply(t, s)
			order += s.name + " "
		}
		got := b.get(t, id)
		got.ID, got.UpdatedAt = want.ID, want.UpdatedAt
		require.Equal(t, want, got, "order: %s", order)
	}
}

func TestExhaustedStatuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := b.t0
	cases := []struct {
		reason string
		status jobstore.Status
	}{
		{contract.ExhaustedNonRetryable, jobstore.StatusFailed},
		{contract.ExhaustedRetriesDisabled, jobstore.StatusFailed},
		{contract.ExhaustedMaxRetries, jobstore.StatusFailedMaxRetries},
	}
	for _, tc := range cases {
		id := "x-" + tc.reason
		b.apply(t, jobMsg(id, "data_enrichment", 1, "", at))
		b.apply(t, failed(id, "data_enrichment", 1, "validation", "invalid email", "", at))
		b.apply(t, exhausted(id, "data_enrichment", 1, tc.reason, "validation", "invalid email", 0, 5, at))
		j := b.get(t, id)
		require.Equal(t, tc.status, j.Status, tc.reason)
		require.Equal(t, tc.reason, j.StatusReason)
		require.Equal(t, tc.reason != contract.ExhaustedRetriesDisabled, j.RetryEnabled)
		require.Equal(t, "invalid email", j.LastErrorMessage)
		require.Nil(t, j.CompletedAt)
		// A redelivered job message of that attempt does not revive it.
		b.apply(t, jobMsg(id, "data_enrichment", 1, "", at))
		require.Equal(t, tc.status, b.get(t, id).Status)
	}
}

func TestCancelThenManualRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := b.t0
	b.apply(t, jobMsg("c1", "email_campaign", 1, "", at))
	b.apply(t, failed("c1", "email_campaign", 1, "network", "connection reset", "", at))
	b.apply(t, scheduled("c1", "email_campaign", 2, 1, 4, at.Add(time.Hour), at))
	b.apply(t, cancelled("c1", 2, at.Add(time.Minute)))
	j := b.get(t, "c1")
	require.Equal(t, jobstore.StatusCancelled, j.Status)
	require.Equal(t, "cancelled by ops: customer left", j.StatusReason)
	require.Nil(t, j.NextRetryAt)
	// The scheduler's manual retry moves to the next attempt.
	b.apply(t, scheduled("c1", "email_campaign", 3, 0, 4, at.Add(2*time.Minute), at.Add(2*time.Minute)))
	j = b.get(t, "c1")
	require.Equal(t, jobstore.StatusRetrying, j.Status)
	require.Equal(t, 0, j.RetryCount, "a reset manual retry starts a new budget")
	require.Empty(t, j.StatusReason)
}

func TestNewRowsTakeTheirPolicyDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seven, off := 7, false
	for _, tc := range []struct {
		job        contract.JobData
		maxRetries int
		enabled    bool
	}{
		{contract.JobData{ID: "p1", JobType: "linkedin_outreach", Attempt: 1}, 3, true},
		{contract.JobData{ID: "p2", JobType: "some_new_type", Attempt: 1}, 5, true},
		{contract.JobData{ID: "p3", JobType: "email_campaign", Attempt: 1, MaxRetries: &seven, RetryEnabled: &off}, 7, false},
	} {
		require.NoError(t, jobstore.ApplyJob(b.ctx, b.pool, tc.job, b.t0))
		j := b.get(t, tc.job.ID)
		require.Equal(t, tc.maxRetries, *j.MaxRetries, tc.job.ID)
		require.Equal(t, tc.enabled, j.RetryEnabled, tc.job.ID)
		require.Equal(t, jobstore.StatusInProgress, j.Status)
		require.Equal(t, 0, j.RetryCount)
	}
	// A success seen before its job message makes a row without a type;
	// the job message fills it in and does not undo the completion.
	b.apply(t, succeeded("early", 1, b.t0.Add(time.Second)))
	b.apply(t, jobMsg("early", "email_campaign", 1, "", b.t0))
	j := b.get(t, "early")
	require.Equal(t, jobstore.StatusCompleted, j.Status)
	require.Equal(t, "email_campaign", j.JobType)
	require.Equal(t, b.t0, j.CreatedAt.UTC())
}

func TestCurrentStepComesFromTheCheckpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, tc := range []struct{ cp, step string }{
		{`{"step":"send_email","done":["a"]}`, "send_email"},
		{`{"step":2}`, "2"},
		{`{"done":["a"]}`, ""},
		{`{"step":{"name":"x"}}`, ""},
		{`["not","an","object"]`, ""},
	} {
		id := fmt.Sprintf("s%d", i)
		b.apply(t, jobMsg(id, "workflow_step", 2, tc.cp, b.t0))
		j := b.get(t, id)
		require.Equal(t, tc.step, j.CurrentStep, tc.cp)
		require.JSONEq(t, tc.cp, string(j.Checkpoint))
	}
	_, err := jobstore.Get(b.ctx, b.pool, "missing")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

func held(id, typ string, attempt int, reason string, until *time.Time, at time.Time) step {
	ev := lifecycle(id, contract.Held, at)
	ev.Held = &contract.HeldData{Kind: contract.KindJob, ID: id, Attempt: attempt, JobType: typ, Reason: reason,
		Until: until, Detail: "rate limit of 10 per 1s reached", Checkpoint: json.RawMessage(`{"step":"fetch"}`)}
	return step{name: fmt.Sprintf("held(%d)", attempt), ev: &ev}
}

// holdDecision is the scheduler's decision for a hold of attempt 1 of id:
// attempt 2 at until, no retry used.
func holdDecision(id, typ string, until, at time.Time, decidedBy, reason string) step {
	s := scheduled(id, typ, 2, 0, 3, until, at)
	s.ev.Scheduled.Decision.DecidedBy = decidedBy
	s.ev.Scheduled.Decision.HoldReason = reason
	return s
}

func TestHeldJobIsNeitherFailedNorRetrying(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := func(s int) time.Time { return b.t0.Add(time.Duration(s) * time.Second) }
	until := at(60)

	b.apply(t, jobMsg("j1", "crawl", 1, "", at(0)))
	b.apply(t, held("j1", "crawl", 1, contract.HoldThrottle, &until, at(1)))
	j := b.get(t, "j1")
	require.Equal(t, jobstore.StatusHeld, j.Status)
	require.Equal(t, "held: throttle: rate limit of 10 per 1s reached", j.StatusReason)
	require.Equal(t, until, j.NextRetryAt.UTC())
	require.Empty(t, j.LastErrorMessage, "a hold is not an error")
	require.Nil(t, j.LastErrorTimestamp)
	require.Equal(t, "fetch", j.CurrentStep)

	b.apply(t, holdDecision("j1", "crawl", until, at(1), contract.DecidedByHold, contract.HoldThrottle))
	j = b.get(t, "j1")
	require.Equal(t, jobstore.StatusHeld, j.Status, "the scheduler's decision for a hold keeps the job held")
	require.Equal(t, 0, j.RetryCount)
	require.Equal(t, "held: throttle", j.StatusReason)

	b.apply(t, jobMsg("j1", "crawl", 2, "", until))
	require.Equal(t, jobstore.StatusInProgress, b.get(t, "j1").Status)
	b.apply(t, succeeded("j1", 2, at(61)))
	j = b.get(t, "j1")
	require.Equal(t, jobstore.StatusCompleted, j.Status)
	require.Equal(t, 0, j.RetryCount, "the hold used no retry")
}

func TestHeldFactArrivingLateDoesNotUndoTheDecision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := func(s int) time.Time { return b.t0.Add(time.Duration(s) * time.Second) }
	until := at(30)
	dec := holdDecision("j2", "crawl", until, at(1), contract.DecidedByPauseUntil, contract.HoldPause)
	for _, s := range []step{jobMsg("j2", "crawl", 2, "", until), dec, held("j2", "crawl", 1, contract.HoldPause, &until, at(1))} {
		b.apply(t, s)
	}
	require.Equal(t, jobstore.StatusInProgress, b.get(t, "j2").Status)
}
