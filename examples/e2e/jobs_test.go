package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/stores/jobstore"
)

func TestTimeoutTwiceThenSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var seen attempts
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		"email_campaign": func(ctx context.Context, job *worker.Job) error {
			seen.add(job)
			if job.Attempt <= 2 {
				<-ctx.Done() // overrun timeout_ms: a real timeout
				return ctx.Err()
			}
			return nil
		},
	})
	id := e.enqueue(t, contract.JobData{JobType: "email_campaign", TimeoutMS: 50})

	e.waitJob(t, id, jobstore.StatusCompleted)
	e.projected(t)
	j := e.waitJob(t, id, jobstore.StatusCompleted)
	require.Equal(t, 3, j.Attempt)
	require.Equal(t, 2, j.RetryCount)
	require.Equal(t, 4, *j.MaxRetries, "email_campaign allows 4 retries")
	require.Equal(t, "timeout", j.LastErrorClass)
	require.Equal(t, []int{1, 2, 3}, seen.numbers())

	h := e.waitHistory(t, id, 7)
	require.Equal(t, []string{"failed", "scheduled", "due", "failed", "rescheduled", "due", "succeeded"}, events(h))
	require.Equal(t, "timeout", h[0].ErrorClass)
	require.Equal(t, "timeout", h[3].ErrorClass)
	// 100ms base doubling, no jitter: 100ms then 200ms, by backoff.
	require.Equal(t, int64(100), *h[1].DelayMS)
	require.Equal(t, int64(200), *h[4].DelayMS)
	require.Equal(t, "backoff", h[1].DecidedBy)
	require.Equal(t, "email-campaign", h[1].PolicyName)
	// Each retry ran no earlier than the time the scheduler chose.
	runs := seen.list()
	require.False(t, runs[1].at.Before(*h[1].NextAttemptAt), "attempt 2 ran at %s, before %s", runs[1].at, *h[1].NextAttemptAt)
	require.False(t, runs[2].at.Before(*h[4].NextAttemptAt), "attempt 3 ran at %s, before %s", runs[2].at, *h[4].NextAttemptAt)
	require.GreaterOrEqual(t, h[1].NextAttemptAt.Sub(h[0].At), 100*time.Millisecond)

	var an jobstore.Analytics
	require.Equal(t, 200, e.call(t, "GET", "/v1/analytics/retries?days=1&job_type=email_campaign", nil, &an))
	require.Len(t, an.JobTypes, 1)
	a := an.JobTypes[0]
	require.Equal(t, int64(1), a.TotalJobs)
	require.Equal(t, int64(1), a.Succeeded)
	require.Equal(t, 1.0, *a.SuccessRate)
	require.Equal(t, 3.0, *a.AvgAttemptsToSuccess)
	require.Equal(t, int64(2), a.TotalRetries)
	require.Equal(t, []jobstore.RetryBucket{{Retries: 2, Jobs: 1}}, a.RetryDistribution)
	require.Equal(t, []jobstore.ClassCount{{Class: "timeout", Count: 2}}, a.ErrorsByClass)
	require.Equal(t, []jobstore.ErrorPattern{{Pattern: "attempt timed out after <n>ms: context deadline exceeded", Class: "timeout", Count: 2}}, a.TopErrors)
	require.GreaterOrEqual(t, *a.TimeToSuccessMS.P50, 300.0, "two retries of 100 and 200ms")

	var detail jobs.JobDetail
	require.Equal(t, 200, e.call(t, "GET", "/v1/jobs/"+id, nil, &detail))
	require.Equal(t, jobstore.StatusCompleted, detail.Job.Status)
	require.Len(t, detail.History, 7)
}

func TestValidationFailureIsNotRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := e.failingWorker(t, "data_enrichment", errclass.New(errclass.Validation, "company domain is malformed"))
	id := e.enqueue(t, contract.JobData{JobType: "data_enrichment"})
	j := e.waitJob(t, id, jobstore.StatusFailed)
	require.Equal(t, "non_retryable", j.StatusReason)
	require.Equal(t, 0, j.RetryCount)
	require.Equal(t, "validation", j.LastErrorClass)
	require.Equal(t, []string{"failed", "exhausted"}, events(e.waitHistory(t, id, 2)))
	require.Equal(t, []int{1}, seen.numbers(), "the job ran once")
}

// A handler can stop retries of an error whose class is retryable
// (errclass.NonRetryable): the failed event carries error.non_retryable.
func TestNonRetryableErrorIsNotRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := e.failingWorker(t, "linkedin_outreach", errclass.NonRetryable(errors.New("profile was deleted (HTTP 503)")))
	id := e.enqueue(t, contract.JobData{JobType: "linkedin_outreach"})
	j := e.waitJob(t, id, jobstore.StatusFailed)
	require.Equal(t, "non_retryable", j.StatusReason)
	require.Equal(t, "temporary", j.LastErrorClass)
	require.Equal(t, []int{1}, seen.numbers(), "the job ran once")
}

func TestMaxRetriesGivesFailedMaxRetries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := e.failingWorker(t, "data_enrichment", errors.New("upstream temporarily unavailable"))
	two := 2
	id := e.enqueue(t, contract.JobData{JobType: "data_enrichment", MaxRetries: &two})
	j := e.waitJob(t, id, jobstore.StatusFailedMaxRetries)
	require.Equal(t, 3, j.Attempt)
	require.Equal(t, 2, j.RetryCount)
	require.Equal(t, 2, *j.MaxRetries, "the job's override, not the policy's 5")
	require.Equal(t, "max_retries", j.StatusReason)
	require.Equal(t, "temporary", j.LastErrorClass)
	require.Equal(t, []int{1, 2, 3}, seen.numbers())
	require.Equal(t, []string{"failed", "scheduled", "due", "failed", "rescheduled", "due", "failed", "exhausted"}, events(e.waitHistory(t, id, 8)))
}

// steps is a three-step job that checkpoints after each step and starts
// after the last checkpointed step.
type steps struct {
	fx     effects
	seen   attempts
	failAt string
}

var stepNames = []string{"fetch_profile", "send_message", "log_activity"}

func (s *steps) handle(ctx context.Context, job *worker.Job) error {
	s.seen.add(job)
	var cp struct {
		Step string `json:"step"`
	}
	if _, err := job.DecodeCheckpoint(&cp); err != nil {
		return err
	}
	start := 0
	for i, name := range stepNames {
		if name == cp.Step {
			start = i + 1
		}
	}
	for _, name := range stepNames[start:] {
		if name == s.failAt && job.Attempt == 1 {
			return errclass.New(errclass.Network, name+": connection reset by peer")
		}
		s.fx.apply(job.ID + ":" + name)
		if err := job.SetCheckpoint(map[string]any{"step": name, "attempt": job.Attempt}); err != nil {
			return err
		}
	}
	return nil
}

func TestThreeStepJobResumesAtTheFailedStep(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := &steps{failAt: "send_message"}
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{"workflow_step": s.handle})
	id := e.enqueue(t, contract.JobData{JobType: "workflow_step"})

	e.waitJob(t, id, jobstore.StatusCompleted)
	runs := s.seen.list()
	require.Len(t, runs, 2)
	require.Empty(t, runs[0].checkpoint)
	require.JSONEq(t, `{"step":"fetch_profile","attempt":1}`, runs[1].checkpoint, "attempt 2 starts from step 1's checkpoint")
	applied, tries := s.fx.snapshot()
	require.Equal(t, 3, tries, "every step ran once: step 1 in attempt 1, steps 2 and 3 in attempt 2")
	require.Len(t, applied, 3)
	// current_step is the step of the last checkpoint reported: the last
	// step that worked before the failure.
	j := e.waitJob(t, id, jobstore.StatusCompleted)
	require.Equal(t, "fetch_profile", j.CurrentStep)
	h := e.waitHistory(t, id, 4)
	require.Equal(t, "network", h[0].ErrorClass)
}

func TestKilledWorkerLosesNothingAndAppliesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var fx effects
	// The first worker applies the effect and dies before it can report:
	// its connection goes away, as with kill -9.
	nc, err := nats.Connect(e.srv.ClientURL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var died atomic.Bool
	e.startWorker(t, worker.Config{JS: js, AckWait: time.Second, DisableDueRouter: true}, map[string]worker.Handler{
		"email_campaign": func(_ context.Context, job *worker.Job) error {
			fx.apply(job.IdempotencyKey())
			nc.Close()
			died.Store(true)
			return nil
		},
	})
	id := e.enqueue(t, contract.JobData{JobType: "email_campaign"})
	require.Eventually(t, died.Load, wait, 10*time.Millisecond)

	// A new worker gets the job once the ack wait has passed.
	var seen attempts
	e.startWorker(t, worker.Config{AckWait: time.Second}, map[string]worker.Handler{
		"email_campaign": func(_ context.Context, job *worker.Job) error {
			seen.add(job)
			fx.apply(job.IdempotencyKey())
			return nil
		},
	})
	j := e.waitJob(t, id, jobstore.StatusCompleted)
	require.Equal(t, 1, j.Attempt)
	require.Equal(t, []int{1}, seen.numbers(), "redelivered, not retried")
	applied, tries := fx.snapshot()
	require.Equal(t, map[string]int{id + ":1": 1}, applied, "one effect under the idempotency key")
	require.Equal(t, 2, tries)
	require.Empty(t, e.history(t, id), "no failure was ever reported")

	// A worker stopped mid-job (its Stop deadline passed) hands the job
	// back without a report; the other worker runs it at once.
	release := make(chan struct{})
	stopping := e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		"slow_report": func(ctx context.Context, job *worker.Job) error {
			close(release)
			<-ctx.Done()
			return ctx.Err()
		},
	})
	id2 := e.enqueue(t, contract.JobData{JobType: "slow_report"})
	<-release
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, stopping.Stop(ctx), context.DeadlineExceeded)
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		"slow_report": func(_ context.Context, job *worker.Job) error {
			fx.apply(job.IdempotencyKey())
			return nil
		},
	})
	e.waitJob(t, id2, jobstore.StatusCompleted)
	applied, _ = fx.snapshot()
	require.Contains(t, applied, id2+":1")
	require.Empty(t, e.history(t, id2))
}

func TestPolicyUpdateChangesLaterDecisions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var fails atomic.Int32
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		"email_campaign": func(_ context.Context, job *worker.Job) error {
			fails.Add(1)
			return errors.New("upstream temporarily unavailable")
		},
	})
	var before map[string]any
	require.Equal(t, 200, e.call(t, "GET", "/v1/policies/job/email_campaign", nil, &before))
	version := int(before["version"].(float64))

	one := 1
	first := e.enqueue(t, contract.JobData{JobType: "email_campaign", MaxRetries: &one})
	e.waitJob(t, first, jobstore.StatusFailedMaxRetries)
	h := e.waitHistory(t, first, 5)
	require.Equal(t, version, h[1].PolicyVersion)
	require.Equal(t, int64(100), *h[1].DelayMS)

	// The operator makes email_campaign retry nothing from now on.
	var updated map[string]any
	require.Equal(t, 200, e.call(t, "PUT", "/v1/policies/job/email_campaign", map[string]any{
		"name": "email-campaign", "max_retries": 0, "base_delay_ms": 100, "max_delay_ms": 2000,
		"jitter": "none", "non_retryable_classes": []string{"validation"}, "updated_by": "e2e",
	}, &updated))
	require.Equal(t, float64(version+1), updated["version"])

	second := e.enqueue(t, contract.JobData{JobType: "email_campaign"})
	j := e.waitJob(t, second, jobstore.StatusFailedMaxRetries)
	require.Equal(t, 1, j.Attempt, "no retry under the new policy")
	require.Equal(t, 0, *j.MaxRetries)
	h2 := e.waitHistory(t, second, 2)
	require.Equal(t, []string{"failed", "exhausted"}, events(h2))
	require.Equal(t, version+1, h2[1].PolicyVersion)
}

func TestManualBulkRetryAndCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var fixed atomic.Bool
	var seen attempts
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		"linkedin_outreach": func(_ context.Context, job *worker.Job) error {
			seen.add(job)
			if !fixed.Load() {
				return errclass.New(errclass.Authentication, "invalid access token")
			}
			return nil
		},
		"data_enrichment": func(_ context.Context, job *worker.Job) error {
			return errors.New("upstream temporarily unavailable")
		},
	})
	var ids []string
	for range 3 {
		ids = append(ids, e.enqueue(t, contract.JobData{JobType: "linkedin_outreach"}))
	}
	for _, id := range ids {
		e.waitJob(t, id, jobstore.StatusFailed)
	}
	var page jobstore.Page
	require.Equal(t, 200, e.call(t, "GET", "/v1/jobs?status=failed&job_type=linkedin_outreach", nil, &page))
	require.Len(t, page.Jobs, 3)

	// The token is renewed: retry one job by hand, then the rest in bulk.
	fixed.Store(true)
	var accepted jobs.ActionResponse
	require.Equal(t, 202, e.call(t, "POST", "/v1/jobs/"+ids[0]+"/retry", map[string]any{"reason": "token renewed"}, &accepted))
	j := e.waitJob(t, ids[0], jobstore.StatusCompleted)
	require.Equal(t, 2, j.Attempt)
	h := e.waitHistory(t, ids[0], 5)
	require.Equal(t, []string{"failed", "exhausted", "rescheduled", "due", "succeeded"}, events(h))
	require.Equal(t, "manual", h[2].DecidedBy)

	var dry jobs.DryRunResponse
	filter := map[string]any{"status": "failed", "job_type": "linkedin_outreach", "error_class": "authentication"}
	require.Equal(t, 200, e.call(t, "POST", "/v1/jobs/bulk-retry", map[string]any{"filter": filter, "dry_run": true}, &dry))
	require.Equal(t, int64(2), dry.Matched)
	var op jobs.OperationResponse
	require.Equal(t, 202, e.call(t, "POST", "/v1/jobs/bulk-retry", map[string]any{"filter": filter, "dry_run": false, "rate_per_second": 20, "reason": "token renewed"}, &op))
	require.Equal(t, 2, op.Operation.Total)
	for _, id := range ids[1:] {
		e.waitJob(t, id, jobstore.StatusCompleted)
	}
	require.Eventually(t, func() bool {
		var got jobs.OperationResponse
		e.call(t, "GET", "/v1/operations/"+op.Operation.ID, nil, &got)
		return got.Operation.Status == jobstore.OperationCompleted && got.Operation.Released == 2
	}, wait, 20*time.Millisecond)
	require.Len(t, seen.list(), 6, "three failures, three successful retries")

	// A job waiting for its retry is cancelled: no due follows.
	_, err := e.pool.Exec(e.ctx, `UPDATE retry_policies SET base_delay_ms = 3600000, max_delay_ms = 3600000 WHERE kind = 'job' AND job_type = 'data_enrichment'`)
	require.NoError(t, err)
	waiting := e.enqueue(t, contract.JobData{JobType: "data_enrichment"})
	e.waitJob(t, waiting, jobstore.StatusRetrying)
	require.Equal(t, 202, e.call(t, "POST", "/v1/jobs/"+waiting+"/cancel", map[string]any{"reason": "customer left", "by": "mallory"}, &accepted))
	c := e.waitJob(t, waiting, jobstore.StatusCancelled)
	require.Equal(t, "cancelled by alice: customer left", c.StatusReason, "the principal, not the body's by")
	var apiErr map[string]map[string]string
	require.Equal(t, 409, e.call(t, "POST", "/v1/jobs/"+waiting+"/cancel", nil, &apiErr))
	require.Equal(t, 404, e.call(t, "POST", "/v1/jobs/never-failed/retry", nil, &apiErr))
}

func TestMalformedJobsAreTerminated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var ran atomic.Int32
	e.startWorker(t, worker.Config{}, map[string]worker.Handler{
		"email_campaign": func(context.Context, *worker.Job) error {
			ran.Add(1)
			return nil
		},
	})
	for i, body := range []string{`{"id":`, `{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":{"id":"a","job_type":"email_campaign","attempt":0}}`} {
		msg := nats.NewMsg("jobs.email_campaign")
		msg.Data = []byte(body)
		msg.Header.Set(contract.HeaderMsgID, fmt.Sprintf("garbage-%d", i))
		_, err := e.js.PublishMsg(e.ctx, msg)
		require.NoError(t, err)
	}
	good := e.enqueue(t, contract.JobData{JobType: "email_campaign", Payload: json.RawMessage(`{"n":1}`)})
	e.waitJob(t, good, jobstore.StatusCompleted)
	for _, durable := range []string{worker.ConsumerName("email_campaign"), jobs.ProjectionDurable} {
		require.Eventually(t, func() bool {
			c, err := e.js.Consumer(e.ctx, contract.StreamJobs, durable)
			require.NoError(t, err)
			info, err := c.Info(e.ctx)
			require.NoError(t, err)
			return info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0
		}, wait, 20*time.Millisecond, durable)
	}
	require.Equal(t, int32(1), ran.Load())
	require.Equal(t, 1, pgtest.Count(t, e.pool, `SELECT count(*) FROM jobs`))
}
