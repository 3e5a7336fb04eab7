package ingress_test

// End-to-end tests: ingress and the real scheduler in one process, with an
// event policy small enough that retries run in seconds.

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/scheduler"
)

// withScheduler sets a fast event policy (base delay, max delay, max
// retries) and starts a scheduler on the bundle's database and NATS.
func (b *bundle) withScheduler(t *testing.T, base, maxDelay time.Duration, maxRetries int) *scheduler.Scheduler {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE retry_policies
		SET base_delay_ms = $1, multiplier = 1, max_delay_ms = $2, jitter = 'none', jitter_ms = 0, max_retries = $3
		WHERE kind = 'event' AND job_type = ''`, base.Milliseconds(), maxDelay.Milliseconds(), maxRetries)
	require.NoError(t, err)
	s, err := scheduler.New(scheduler.Config{
		Pool:       b.pool,
		JS:         b.js,
		Logger:     testLogger(t),
		Registerer: prometheus.NewRegistry(),
		MaxIdle:    50 * time.Millisecond,
		AckWait:    time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, s.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Stop(ctx)
	})
	return s
}

// schedulerState is the scheduler's state of an event's retry.
func (b *bundle) schedulerState(t *testing.T, id string) string {
	t.Helper()
	var state string
	if err := b.pool.QueryRow(b.ctx, `SELECT state FROM retries WHERE kind = 'event' AND item_id = $1`, id).Scan(&state); err != nil {
		return ""
	}
	return state
}

func (b *bundle) requireAdmittedOnce(t *testing.T, ids ...string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(b.admittedIDs(t)) == len(ids) }, eventually, 50*time.Millisecond)
	admitted := b.admittedIDs(t)
	for _, id := range ids {
		require.Equal(t, 1, admitted[id], "event %s admitted once", id)
		require.Equal(t, "admitted", b.status(t, id))
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func TestE2EThrottledEventsAdmittedAfterWindowReset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Max delay 2s: a retry-after hint beyond it is capped, so the
	// deferrals come back every 2s at most.
	b.withScheduler(t, 100*time.Millisecond, 2*time.Second, 50)
	// A day-long window first, so exactly three are admitted whatever the
	// machine's speed; then one-second windows.
	b.putSource(t, "billing", map[string]any{"rate_limit": 3, "rate_window": "24h"})

	all := ids("t", 9)
	for _, id := range all {
		b.post(t, event(id, "billing", "invoice.paid"))
	}
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE scheduled_attempt = 2`) == 6
	}, eventually, 20*time.Millisecond, "six of nine are deferred and scheduled")
	require.Len(t, b.admittedIDs(t), 3)
	b.putSource(t, "billing", map[string]any{"rate_limit": 3, "rate_window": "1s"})

	b.requireAdmittedOnce(t, all...)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE retry_state = 'completed'`) ==
			b.count(t, `SELECT count(*) FROM event_ingress_retries`)
	}, eventually, 20*time.Millisecond)
	for _, id := range all {
		if b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE event_id = $1`, id) == 1 {
			require.Eventually(t, func() bool { return b.schedulerState(t, id) == "succeeded" }, eventually, 20*time.Millisecond, id)
		}
	}
	// No window admitted more than the limit.
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_source_windows WHERE admitted > 3`))
	require.EqualValues(t, 6, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "scheduled"}))
	require.EqualValues(t, 6, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "completed"}))

	require.Equal(t, b.count(t, `SELECT count(*) FROM event_ingress_retries`),
		b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE metadata->>'decided_by' = 'throttle'`),
		"the window reset decided every retry time")
}

func TestE2EPausedSourceAdmittedAfterResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.withScheduler(t, 100*time.Millisecond, time.Second, 1000)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", map[string]any{"reason": "upgrade"}, nil))

	all := ids("p", 3)
	for _, id := range all {
		b.post(t, event(id, "crm", "contact.created"))
	}
	// Retried while paused: deferred again and again, never admitted.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE attempts >= 3`) == 3
	}, eventually, 20*time.Millisecond)
	require.Empty(t, b.admittedIDs(t))

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, nil))
	b.requireAdmittedOnce(t, all...)
	for _, id := range all {
		require.Eventually(t, func() bool { return b.schedulerState(t, id) == "succeeded" }, eventually, 20*time.Millisecond, id)
	}
}

func TestE2ECancelledDeferralIsNeverAdmitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.withScheduler(t, 100*time.Millisecond, time.Second, 1000)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", nil, nil))
	b.post(t, event("keep", "crm", "contact.created"))
	b.post(t, event("drop", "crm", "contact.created"))
	b.waitStatus(t, "deferred", "keep", "drop")

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/events/drop/cancel", map[string]any{"reason": "test"}, nil))
	require.Eventually(t, func() bool { return b.schedulerState(t, "drop") == "cancelled" }, eventually, 20*time.Millisecond,
		"the scheduler closes the cancelled retry")

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, nil))
	b.requireAdmittedOnce(t, "keep")
	require.Equal(t, "cancelled", b.status(t, "drop"))
	require.NotContains(t, b.admittedIDs(t), "drop")
}

func TestE2EDeferralExhausts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", nil, nil))
	b.post(t, event("gone", "crm", "contact.created"))

	b.waitStatus(t, "exhausted", "gone")
	var v ingress.EventView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/events/gone", nil, &v))
	require.Equal(t, "exhausted", v.Retry.State)
	require.Equal(t, 3, v.Retry.Attempts, "two retries after the first attempt")
	require.Contains(t, v.Retry.LastError, "max_retries")
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "crm", "event": "exhausted"}))

	// Resuming does not bring an exhausted event back.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, nil))
	b.drained(t, ingress.ConsumerRetry)
	require.Equal(t, "exhausted", b.status(t, "gone"))
	require.Empty(t, b.admittedIDs(t))
}

func TestE2ECrashBetweenCommitAndPublishAdmitsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.svc.Stop(b.ctx))
	b.putSource(t, "billing", map[string]any{"rate_limit": 2, "rate_window": "1s"})
	_, crashHTTP, kill := b.crashAt(t, ingress.FailpointGateCommitted)
	b.http = crashHTTP
	all := ids("k", 6)
	for _, id := range all {
		b.post(t, event(id, "billing", "invoice.paid"))
	}
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM workflow_events WHERE status <> 'received'`) == 6
	}, eventually, 20*time.Millisecond)
	kill()

	b.withScheduler(t, 100*time.Millisecond, 5*time.Second, 50)
	b.start(t, testConfig(t, b.pool, b.js, prometheus.NewRegistry()))
	b.requireAdmittedOnce(t, all...)
	b.drained(t, ingress.ConsumerGate)
	require.Len(t, b.admittedIDs(t), 6)
}

func TestE2EPurgedRetriesStillAdmitOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The window outlasts the test; the policy's max delay (2s) caps the
	// hint, so the dues come after the purges.
	b.withScheduler(t, 100*time.Millisecond, 2*time.Second, 50)
	b.putSource(t, "billing", map[string]any{"rate_limit": 1, "rate_window": "1h"})
	all := ids("g", 4)
	for _, id := range all {
		b.post(t, event(id, "billing", "invoice.paid"))
	}
	// Wait until the scheduler holds the deferrals, then lose RETRIES.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE scheduled_attempt > attempts`) == 3
	}, eventually, 20*time.Millisecond)
	s, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.NoError(t, s.Purge(b.ctx))
	// And INGEST, with every producer sending again.
	s, err = b.js.Stream(b.ctx, contract.StreamIngest)
	require.NoError(t, err)
	require.NoError(t, s.Purge(b.ctx))
	for _, id := range all {
		b.post(t, event(id, "billing", "invoice.paid"))
	}
	b.putSource(t, "billing", map[string]any{})
	b.requireAdmittedOnce(t, all...)
}

// An operator's manual retry (the scheduler's "retry now, from any state")
// of an exhausted or cancelled deferral evaluates the event again: it is
// admitted once its source allows, and the scheduler's item is resolved
// instead of coming due again forever.
func TestE2EManualRetryOfEndedDeferral(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 1)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", nil, nil))
	b.post(t, event("tired", "crm", "contact.created"))
	b.waitStatus(t, "exhausted", "tired")
	b.post(t, event("dropped", "crm", "contact.created"))
	b.waitStatus(t, "deferred", "dropped")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/events/dropped/cancel", nil, nil))
	require.Eventually(t, func() bool { return b.schedulerState(t, "dropped") == "cancelled" }, eventually, 20*time.Millisecond)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, nil))

	for _, id := range []string{"tired", "dropped"} {
		_, err := s.RetryNow(b.ctx, contract.KindEvent, id, scheduler.RetryNowOptions{By: "alice", Reason: "source fixed"})
		require.NoError(t, err)
	}
	b.requireAdmittedOnce(t, "tired", "dropped")
	for _, id := range []string{"tired", "dropped"} {
		require.Eventually(t, func() bool { return b.schedulerState(t, id) == "succeeded" }, eventually, 20*time.Millisecond, id)
		var v ingress.EventView
		require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/events/"+id, nil, &v))
		require.Equal(t, "completed", v.Retry.State, id)
	}
}
