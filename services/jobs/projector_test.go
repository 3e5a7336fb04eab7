package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/pgdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const wait = 15 * time.Second

// t0 is the fixed time the tests date their jobs and facts from.
var t0 = time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	js   jetstream.JetStream
	reg  *prometheus.Registry
	log  zerolog.Logger
}

func setup(t *testing.T) *bundle {
	t.Helper()
	be := backendtest.Start(t, 0)
	natstest.EnsureStreams(t, be.JS)
	return &bundle{
		ctx: be.Ctx, pool: be.Pool, js: be.JS, reg: prometheus.NewRegistry(),
		log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	}
}

func (b *bundle) startProjector(t *testing.T, cfg jobs.ProjectorConfig) *jobs.Projector {
	t.Helper()
	cfg.Pool, cfg.JS, cfg.Logger = b.pool, b.js, b.log
	if cfg.Registerer == nil {
		cfg.Registerer = b.reg
	}
	if cfg.FetchWait == 0 {
		cfg.FetchWait = 200 * time.Millisecond
	}
	p, err := jobs.NewProjector(cfg)
	require.NoError(t, err)
	require.NoError(t, p.Start(b.ctx))
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

func (b *bundle) publish(t *testing.T, msg *nats.Msg) {
	t.Helper()
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

func (b *bundle) publishJob(t *testing.T, d contract.JobData, at time.Time) {
	t.Helper()
	msg, err := contract.NewJobMsg("test", d, at)
	require.NoError(t, err)
	b.publish(t, msg)
}

func (b *bundle) publishEvent(t *testing.T, ev contract.Lifecycle, data interface {
	Validate() error
}, at time.Time) {
	t.Helper()
	b.publish(t, contracttest.LifecycleMsg(t, "test", ev, data, at))
}

func (b *bundle) job(t *testing.T, id string) jobstore.Job {
	t.Helper()
	j, err := jobstore.Get(b.ctx, b.pool, id)
	require.NoError(t, err)
	return j
}

func (b *bundle) eventually(t *testing.T, id string, cond func(jobstore.Job) bool, msg string) jobstore.Job {
	t.Helper()
	var last jobstore.Job
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		j, err := jobstore.Get(b.ctx, b.pool, id)
		if !assert.NoError(c, err) {
			return
		}
		last = j
		assert.True(c, cond(j), "%s: %+v", msg, j)
	}, wait, 10*time.Millisecond)
	return last
}

// metric sums the series of a metric whose labels include the given
// name, value pairs.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return servicetest.Metric(t, reg, name, labels...)
}

// publishLife publishes the life of a job that failed with a timeout once
// and then worked.
func (b *bundle) publishLife(t *testing.T, id string, t0 time.Time) {
	t.Helper()
	b.publishJob(t, contract.JobData{ID: id, JobType: "email_campaign", Attempt: 1}, t0)
	b.publishEvent(t, contract.Failed, contract.FailedData{Kind: "job", ID: id, Attempt: 1, JobType: "email_campaign",
		Error: contract.ErrorInfo{Class: "timeout", Message: "timed out"}, Checkpoint: json.RawMessage(`{"step":"render"}`)}, t0.Add(time.Second))
	b.publishEvent(t, contract.Scheduled, contract.ScheduledData{Kind: "job", ID: id, Attempt: 2, JobType: "email_campaign",
		NextAttemptAt: t0.Add(3 * time.Second), Decision: contract.Decision{RetryCount: 1, MaxRetries: 4}}, t0.Add(time.Second))
	b.publishEvent(t, contract.Due, contract.DueData{Kind: "job", ID: id, Attempt: 2, JobType: "email_campaign", NextAttemptAt: t0.Add(3 * time.Second)}, t0.Add(3*time.Second))
	b.publishJob(t, contract.JobData{ID: id, JobType: "email_campaign", Attempt: 2, Checkpoint: json.RawMessage(`{"step":"render"}`)}, t0.Add(3*time.Second))
	b.publishEvent(t, contract.Succeeded, contract.SucceededData{Kind: "job", ID: id, Attempt: 2}, t0.Add(4*time.Second))
}

func TestProjectorFoldsBothStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startProjector(t, jobs.ProjectorConfig{})
	b.publishLife(t, "j1", t0)
	// 2 job messages and 3 lifecycle facts; the due is not consumed. The
	// streams are read independently: wait for both.
	b.waitApplied(t, b.reg, 2, 3)
	j := b.job(t, "j1")
	require.Equal(t, jobstore.StatusCompleted, j.Status)
	require.Equal(t, 2, j.Attempt)
	require.Equal(t, 1, j.RetryCount)
	require.Equal(t, 4, *j.MaxRetries)
	require.Equal(t, "render", j.CurrentStep)
	require.Equal(t, "timed out", j.LastErrorMessage)
	require.Equal(t, t0, j.CreatedAt.UTC())
	require.Equal(t, t0.Add(4*time.Second), j.CompletedAt.UTC())
	require.Equal(t, t0.Add(3*time.Second), j.LastAttemptAt.UTC())
}

// waitApplied waits until the projection applied jobs messages from JOBS
// and lifecycle facts from RETRIES.
func (b *bundle) waitApplied(t *testing.T, reg *prometheus.Registry, jobs, lifecycle float64) {
	t.Helper()
	require.Eventually(t, func() bool {
		return metric(t, reg, "retryd_jobs_applied_total", "stream", "JOBS") == jobs && metric(t, reg, "retryd_jobs_applied_total", "stream", "RETRIES") == lifecycle
	}, wait, 10*time.Millisecond)
}

func TestProjectorReplayIsAbsorbedByTheInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.startProjector(t, jobs.ProjectorConfig{})
	b.publishLife(t, "j1", t0)
	b.waitApplied(t, b.reg, 2, 3)
	before := b.job(t, "j1")
	require.NoError(t, p.Stop(b.ctx))

	// Deleting the consumers replays both streams from the start, as after
	// a lost consumer: every message comes again.
	for _, stream := range []string{contract.StreamJobs, contract.StreamRetries} {
		require.NoError(t, b.js.DeleteConsumer(b.ctx, stream, jobs.ProjectionDurable))
	}
	reg := prometheus.NewRegistry()
	b.startProjector(t, jobs.ProjectorConfig{Registerer: reg})
	require.Eventually(t, func() bool {
		return metric(t, reg, "retryd_jobs_duplicates_total", "stream", "JOBS") == 2 && metric(t, reg, "retryd_jobs_duplicates_total", "stream", "RETRIES") == 3
	}, wait, 10*time.Millisecond)
	require.Zero(t, metric(t, reg, "retryd_jobs_applied_total", "stream", "JOBS"))
	after := b.job(t, "j1")
	require.Equal(t, before, after, "a replay changes nothing, not even updated_at")
}

func TestProjectorCrashAfterCommitLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var crashed atomic.Bool
	first := b.startProjector(t, jobs.ProjectorConfig{AckWait: time.Second, Failpoint: func(context.Context, string) error {
		crashed.Store(true)
		return errors.New("process killed after commit")
	}})
	b.publishLife(t, "j1", t0)
	require.Eventually(t, crashed.Load, wait, 10*time.Millisecond)
	require.NoError(t, first.Stop(b.ctx))

	// A new process gets every unacked message again after the ack wait.
	reg := prometheus.NewRegistry()
	b.startProjector(t, jobs.ProjectorConfig{AckWait: time.Second, Registerer: reg})
	j := b.eventually(t, "j1", func(j jobstore.Job) bool { return j.Status == jobstore.StatusCompleted }, "job never completed")
	require.Equal(t, 2, j.Attempt)
	for _, stream := range []string{contract.StreamJobs, contract.StreamRetries} {
		require.Eventually(t, func() bool {
			return natstest.Settled(t, b.ctx, b.js, stream, jobs.ProjectionDurable)
		}, wait, 20*time.Millisecond, stream)
	}
	require.Positive(t, metric(t, reg, "retryd_jobs_duplicates_total", "stream", "JOBS")+metric(t, reg, "retryd_jobs_duplicates_total", "stream", "RETRIES"),
		"the redelivered batch must have been recognised by the inbox")
}

func TestProjectorTerminatesMalformedMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startProjector(t, jobs.ProjectorConfig{})
	for i, m := range []struct{ subject, body string }{
		{"jobs.email", `{"not":"an envelope"}`},
		{"jobs.email", `{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":{"id":"a","job_type":"sms","attempt":1}}`},
		{"retry.job.failed.x", `{"specversion":"1.0","id":"x","source":"s","type":"retry.failed","time":"2024-01-01T00:00:00Z","data":{"kind":"job","id":"y","attempt":1,"error":{"message":"m"}}}`},
		{"retry.job.succeeded.x", `[1,2,3]`},
	} {
		msg := nats.NewMsg(m.subject)
		msg.Data = []byte(m.body)
		msg.Header.Set(contract.HeaderMsgID, "bad-"+string(rune('a'+i)))
		b.publish(t, msg)
	}
	b.publishJob(t, contract.JobData{ID: "good", JobType: "email", Attempt: 1}, time.Now())
	b.eventually(t, "good", func(j jobstore.Job) bool { return j.Status == jobstore.StatusInProgress }, "good job not applied")
	require.Eventually(t, func() bool {
		return metric(t, b.reg, "retryd_jobs_malformed_total", "consumer", "JOBS") == 2 && metric(t, b.reg, "retryd_jobs_malformed_total", "consumer", "RETRIES") == 2
	}, wait, 10*time.Millisecond)
	require.Equal(t, 1, pgtest.Count(t, b.pool, `SELECT count(*) FROM jobs`))
}

func TestProjectorConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := jobs.NewProjector(jobs.ProjectorConfig{})
	require.ErrorContains(t, err, "ProjectorConfig.Pool is required")
	_, err = jobs.NewAPI(jobs.APIConfig{})
	require.ErrorContains(t, err, "APIConfig.Pool is required")
}

// Valid facts carrying what Postgres cannot store as is (a NUL byte in an
// error message, a checkpoint step or a cancel reason; a retry count
// beyond int4) are applied, and the facts after them too: one such
// message must not stop the projection.
func TestProjectorAppliesUnstorableValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startProjector(t, jobs.ProjectorConfig{})
	// A NUL inside raw JSON (the checkpoint) is valid input: it is cleaned
	// where it becomes text.
	b.publishEvent(t, contract.Failed, contract.FailedData{Kind: "job", ID: "nul", Attempt: 1, JobType: "email",
		Error: contract.ErrorInfo{Class: "temporary", Message: "smtp down"}, Checkpoint: json.RawMessage(`{"step":"se\u0000nd"}`)}, t0)
	b.publishEvent(t, contract.Scheduled, contract.ScheduledData{Kind: "job", ID: "big", Attempt: 2, JobType: "email",
		NextAttemptAt: t0.Add(time.Minute), Decision: contract.Decision{RetryCount: 1 << 40, MaxRetries: 1 << 40}}, t0)
	// A NUL in a decoded field is malformed input (contract decoding
	// refuses it): terminated and counted, and the facts after it are
	// applied.
	b.publishEvent(t, contract.Failed, contract.FailedData{Kind: "job", ID: "nulmsg", Attempt: 1, JobType: "email",
		Error: contract.ErrorInfo{Class: "temporary", Message: "smtp\x00down"}}, t0)
	msg, err := contract.NewLifecycleMsg("test", contract.Cancelled, contract.CancelledData{Kind: "job", ID: "why", Attempt: 1,
		By: "op\x00", Reason: "no\x00pe"}, t0)
	require.NoError(t, err)
	b.publish(t, msg)
	b.publishEvent(t, contract.Succeeded, contract.SucceededData{Kind: "job", ID: "good", Attempt: 1}, t0)

	b.eventually(t, "good", func(j jobstore.Job) bool { return j.Status == jobstore.StatusCompleted }, "the facts after the odd ones are applied")
	j := b.eventually(t, "nul", func(j jobstore.Job) bool { return j.LastErrorMessage != "" }, "failure applied")
	require.Equal(t, "smtp down", j.LastErrorMessage)
	require.Equal(t, "se\uFFFDnd", j.CurrentStep)
	b.eventually(t, "big", func(j jobstore.Job) bool { return j.Status == jobstore.StatusRetrying }, "decision applied")
	require.Eventually(t, func() bool { return metric(t, b.reg, "retryd_jobs_malformed_total", "consumer", "RETRIES") == 2 }, wait, 10*time.Millisecond)
	require.Zero(t, pgtest.Count(t, b.pool, "SELECT count(*) FROM jobs WHERE job_id IN ('nulmsg', 'why')"), "malformed facts change nothing")
}

// A message the database refuses for a reason nobody foresaw is
// terminated and counted; the rest of its batch is applied.
func TestProjectorTerminatesWhatTheDatabaseRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.job_id = 'poison' THEN
		RAISE EXCEPTION 'refused' USING ERRCODE = '22023';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_poison();`)
	require.NoError(t, err)
	for _, id := range []string{"before", "poison", "after"} {
		b.publishEvent(t, contract.Succeeded, contract.SucceededData{Kind: "job", ID: id, Attempt: 1}, t0)
	}
	// Started after publishing, so the three arrive in one batch.
	b.startProjector(t, jobs.ProjectorConfig{})
	b.eventually(t, "after", func(j jobstore.Job) bool { return j.Status == jobstore.StatusCompleted }, "after applied")
	b.eventually(t, "before", func(j jobstore.Job) bool { return j.Status == jobstore.StatusCompleted }, "before applied")
	require.Eventually(t, func() bool { return metric(t, b.reg, "retryd_jobs_malformed_total", "consumer", "RETRIES") == 1 }, wait, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return natstest.Settled(t, b.ctx, b.js, contract.StreamRetries, jobs.ProjectionDurable)
	}, wait, 20*time.Millisecond, "the refused message is terminated, not redelivered")
	_, err = jobstore.Get(b.ctx, b.pool, "poison")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}

// A consumer deleted while the projector runs is created again (from the
// start of its stream: the inbox absorbs the replay) and folding goes on.
func TestProjectorRecreatesDeletedConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startProjector(t, jobs.ProjectorConfig{})
	b.publishEvent(t, contract.Succeeded, contract.SucceededData{Kind: "job", ID: "before", Attempt: 1}, t0)
	b.eventually(t, "before", func(j jobstore.Job) bool { return j.Status == jobstore.StatusCompleted }, "before applied")
	for _, stream := range []string{contract.StreamJobs, contract.StreamRetries} {
		require.NoError(t, b.js.DeleteConsumer(b.ctx, stream, jobs.ProjectionDurable))
	}
	b.publishJob(t, contract.JobData{ID: "after", JobType: "email", Attempt: 1}, t0)
	b.publishEvent(t, contract.Failed, contract.FailedData{Kind: "job", ID: "after", Attempt: 1, JobType: "email",
		Error: contract.ErrorInfo{Class: "timeout", Message: "slow"}}, t0.Add(time.Second))
	b.eventually(t, "after", func(j jobstore.Job) bool { return j.LastErrorClass == "timeout" && j.LastAttemptAt != nil },
		"both streams are folded again")
	// The recreated consumer starts at the beginning of the stream: its
	// second delivery is the stream's second message. (The replayed
	// first one is dropped by the inbox, or, when the old consumer's ack
	// is still in flight, taken by the new consumer of the same name as
	// an ack of its own delivery: either way it is not applied twice.)
	info, err := b.js.Consumer(b.ctx, contract.StreamRetries, jobs.ProjectionDurable)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ci, err := info.Info(b.ctx)
		require.NoError(t, err)
		return ci.Delivered.Consumer >= 2 && ci.AckFloor.Stream >= 2
	}, wait, 10*time.Millisecond)
	ci, err := info.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, ci.Delivered.Stream, ci.Delivered.Consumer, "replayed from the first message")
	require.EqualValues(t, 2, metric(t, b.reg, "retryd_jobs_applied_total", "stream", "RETRIES"), "before and after, each applied once")
}

// The projection prunes its own old inbox claims at start and keeps
// recent ones and other consumers'.
func TestProjectorPrunesItsInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
		INSERT INTO inbox (consumer, msg_id, applied_at) VALUES
			('jobs-projection', 'old', now() - interval '8 days'),
			('jobs-projection', 'recent', now() - interval '1 day'),
			('scheduler', 'theirs', now() - interval '8 days')`)
	require.NoError(t, err)
	b.startProjector(t, jobs.ProjectorConfig{})
	require.Eventually(t, func() bool {
		return pgtest.Count(t, b.pool, "SELECT count(*) FROM inbox WHERE msg_id = 'old'") == 0
	}, wait, 10*time.Millisecond)
	left := pgtest.Strings(t, b.pool, "SELECT msg_id FROM inbox WHERE msg_id IN ('recent', 'theirs') ORDER BY msg_id")
	require.Equal(t, []string{"recent", "theirs"}, left)

	_, err = jobs.NewProjector(jobs.ProjectorConfig{Pool: b.pool, JS: b.js, InboxRetention: time.Minute})
	require.ErrorContains(t, err, "ProjectorConfig.InboxRetention")
}

// The two consumers apply batches that touch the same jobs at once; each
// must lock its rows in one order (job id), or two batches deadlock and
// are handed back. Here every JOBS batch goes up the ids while the RETRIES
// batch beside it goes down the same ids.
func TestProjectorBatchesOfBothStreamsNeverDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const groups, perGroup = 6, 100
	id := func(g, i int) string { return fmt.Sprintf("dl-%d-%03d", g, i) }
	for g := range groups {
		for i := range perGroup {
			b.publishJob(t, contract.JobData{ID: id(g, i), JobType: "crawl", Attempt: 1}, t0)
		}
		for i := perGroup - 1; i >= 0; i-- {
			b.publishEvent(t, contract.Succeeded, contract.SucceededData{Kind: contract.KindJob, ID: id(g, i), Attempt: 1}, t0.Add(time.Second))
		}
	}
	b.startProjector(t, jobs.ProjectorConfig{Batch: perGroup})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var done int
		assert.NoError(c, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM jobs WHERE status = 'completed'`).Scan(&done))
		assert.Equal(c, groups*perGroup, done)
	}, wait, 20*time.Millisecond)
	for _, stream := range []string{contract.StreamJobs, contract.StreamRetries} {
		require.Zero(t, metric(t, b.reg, "retryd_jobs_apply_errors_total", "stream", stream), "batches of %s handed back (deadlocks)", stream)
	}
}
