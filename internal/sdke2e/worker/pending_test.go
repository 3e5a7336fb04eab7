package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/worker"
)

// Short enough for a test, and RepublishAfter past it as Start demands.
const (
	testDupWindow      = 200 * time.Millisecond
	testRepublishAfter = 400 * time.Millisecond
)

// shortDuplicateWindow shrinks RETRIES' duplicate window so that a
// republish can come after it within a test.
func (b *bundle) shortDuplicateWindow(t *testing.T) jetstream.Stream {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, contract.StreamRetries)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.Duplicates = testDupWindow
	s, err = b.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	return s
}

func failing(context.Context, *worker.Job) error { return errors.New("connection refused") }

// failedCopy returns the last message on the job's failed subject, nil
// when there is none.
func failedCopy(t *testing.T, s jetstream.Stream, id string) *jetstream.RawStreamMsg {
	t.Helper()
	m, err := s.GetLastMsgForSubject(context.Background(), contract.RetrySubject(contract.KindJob, contract.Failed, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	require.NoError(t, err)
	return m
}

// copies counts the messages stored on the job's failed subject.
func copies(t *testing.T, s jetstream.Stream, id string) uint64 {
	t.Helper()
	subj := contract.RetrySubject(contract.KindJob, contract.Failed, id)
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	require.NoError(t, err)
	return info.State.Subjects[subj]
}

// failJob enqueues a job of type "flaky" and waits for its failed fact.
func (b *bundle) failJob(t *testing.T) string {
	t.Helper()
	id := b.enqueue(t, contract.JobData{JobType: "flaky"})
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Failed, ev.Event)
	require.Equal(t, id, ev.ID)
	return id
}

// scheduledMsg is the decision the scheduler publishes for a first
// failure.
func scheduledMsg(t *testing.T, id string, attempt int) ([]byte, string) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("retryd/scheduler", contract.Scheduled, &contract.ScheduledData{
		Kind: contract.KindJob, ID: id, Attempt: attempt, NextAttemptAt: time.Now().Add(time.Hour).UTC(),
	}, time.Now())
	require.NoError(t, err)
	return msg.Data, msg.Subject
}

func (b *bundle) pendingIs(t *testing.T, n float64) {
	t.Helper()
	require.Eventually(t, func() bool { return servicetest.Metric(t, b.reg, "retryd_worker_pending_facts") == n },
		wait, 10*time.Millisecond, "pending facts: want %v, have %v", n, servicetest.Metric(t, b.reg, "retryd_worker_pending_facts"))
}

// TestPurgedFailureIsPublishedAgainUntilDecided is the purge of issue 16:
// without the pending set, the purged failure would never come back.
func TestPurgedFailureIsPublishedAgainUntilDecided(t *testing.T) {
	t.Parallel()
	b := setup(t)
	retries := b.shortDuplicateWindow(t)
	b.newWorker(t, worker.Config{RepublishAfter: testRepublishAfter}, map[string]worker.Handler{"flaky": failing})
	id := b.failJob(t)
	orig := failedCopy(t, retries, id)
	require.NotNil(t, orig)
	b.pendingIs(t, 1)

	require.NoError(t, retries.Purge(context.Background()))
	require.Eventually(t, func() bool { return failedCopy(t, retries, id) != nil }, wait, 10*time.Millisecond, "the purged failure was not published again")
	again := failedCopy(t, retries, id)
	require.Equal(t, orig.Header.Get(contract.HeaderMsgID), again.Header.Get(contract.HeaderMsgID), "the same fact: the scheduler's inbox knows it by its id")
	require.Equal(t, orig.Data, again.Data)
	require.Greater(t, again.Sequence, orig.Sequence)
	require.Equal(t, id, b.nextOutcome(t).ID, "the copy")
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_republished_total", "failed"))

	data, subj := scheduledMsg(t, id, 2)
	require.NoError(t, b.nc.Publish(subj, data))
	b.pendingIs(t, 0)

	// Decided: a later purge does not bring it back. A second failure,
	// purged after the first one's, coming back shows that the loop ran
	// past the first one's time.
	require.NoError(t, retries.Purge(context.Background()))
	later := b.failJob(t)
	require.NoError(t, retries.Purge(context.Background()))
	require.Eventually(t, func() bool { return failedCopy(t, retries, later) != nil }, wait, 10*time.Millisecond)
	require.Nil(t, failedCopy(t, retries, id), "a decided failure was published again")
	require.Equal(t, 2.0, metric(t, b.reg, "retryd_worker_republished_total", "failed"))
}

// TestStoredFactWaitsAndOnlyItsDecisionCounts: a fact still on the stream
// is not published again, lifecycle messages that do not decide it (a
// malformed one, an earlier attempt's) leave it kept, its decision drops
// it, and a duplicate of the decision does no harm.
func TestStoredFactWaitsAndOnlyItsDecisionCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	retries := b.shortDuplicateWindow(t)
	var logs servicetest.Buffer
	w := b.newWorker(t, worker.Config{
		RepublishAfter: testRepublishAfter,
		Logger:         slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}, map[string]worker.Handler{"flaky": failing})
	kept := b.failJob(t)
	keptSeq := failedCopy(t, retries, kept).Sequence
	purged := b.failJob(t)
	b.pendingIs(t, 2)

	// kept's check is due no later than purged's: when purged is back,
	// kept was checked and found on the stream.
	require.NoError(t, retries.Purge(context.Background(), jetstream.WithPurgeSubject(contract.RetrySubject(contract.KindJob, contract.Failed, purged))))
	require.Eventually(t, func() bool { return failedCopy(t, retries, purged) != nil }, wait, 10*time.Millisecond)
	require.Equal(t, purged, b.nextOutcome(t).ID, "the copy")
	require.Equal(t, uint64(1), copies(t, retries, kept), "a failure still on the stream was published again: %s", logs.String())
	require.Equal(t, keptSeq, failedCopy(t, retries, kept).Sequence)
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_republished_total", "failed"))
	require.NotContains(t, logs.String(), "connection refused", "no payload or error message in the logs")
	require.Contains(t, logs.String(), "job_id="+purged)

	// On kept's subscription: garbage, and a decision of the wrong
	// attempt. purged's decision after them is the barrier: messages are
	// matched in order.
	require.NoError(t, b.nc.Publish(contract.RetrySubject(contract.KindJob, contract.Scheduled, kept), []byte("{not json")))
	wrong, subj := scheduledMsg(t, kept, 1)
	require.NoError(t, b.nc.Publish(subj, wrong))
	data, subj := scheduledMsg(t, purged, 2)
	require.NoError(t, b.nc.Publish(subj, data))
	b.pendingIs(t, 1)

	// kept's decision, twice: dropped once.
	data, subj = scheduledMsg(t, kept, 2)
	require.NoError(t, b.nc.Publish(subj, data))
	require.NoError(t, b.nc.Publish(subj, data))
	b.pendingIs(t, 0)
	b.failJob(t)
	b.pendingIs(t, 1)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, w.Stop(ctx))
	require.Contains(t, logs.String(), "pending=1")
	b.pendingIs(t, 0)
}

// TestPendingLimitEvictsTheOldest keeps the newest facts at the limit.
func TestPendingLimitEvictsTheOldest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	retries := b.shortDuplicateWindow(t)
	b.newWorker(t, worker.Config{RepublishAfter: testRepublishAfter, PendingLimit: 1}, map[string]worker.Handler{"flaky": failing})
	oldest := b.failJob(t)
	newest := b.failJob(t)
	b.pendingIs(t, 1)
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_pending_evicted_total"))

	require.NoError(t, retries.Purge(context.Background()))
	require.Eventually(t, func() bool { return failedCopy(t, retries, newest) != nil }, wait, 10*time.Millisecond)
	require.Nil(t, failedCopy(t, retries, oldest), "an evicted fact is not kept")
}

func TestRepublishAfterMustOutlastTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Negative values are refused by New (TestConfigValidation). RETRIES
	// as streams.Ensure makes it has a 2-minute window.
	w, err := worker.New(worker.Config{JS: b.js, RepublishAfter: 2 * time.Minute, DisableDueRouter: true, Registerer: b.reg})
	require.NoError(t, err)
	require.NoError(t, w.Handle("flaky", failing))
	require.ErrorContains(t, w.Start(context.Background()), "Config.RepublishAfter must be longer than the RETRIES duplicate window of 2m0s")

	// Keeping nothing needs no window.
	w, err = worker.New(worker.Config{JS: b.js, RepublishAfter: time.Second, PendingLimit: -1, DisableDueRouter: true, Registerer: b.reg})
	require.NoError(t, err)
	require.NoError(t, w.Handle("flaky", failing))
	require.NoError(t, w.Start(context.Background()))
	require.NoError(t, w.Stop(context.Background()))
}
