package ingress_test

// End-to-end tests: ingress and the real scheduler in one process, with an
// event policy small enough that retries run in seconds.

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
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
		Logger:     servicetest.Logger(t),
		Registerer: prometheus.NewRegistry(),
		MaxIdle:    50 * time.Millisecond,
		AckWait:    time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, s.Start(b.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, s.Stop)
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
	// A hold is not capped by the max delay: the held events wait for the
	// end of their window, or for the release the limit change publishes.
	b.withScheduler(t, 100*time.Millisecond, 2*time.Second, 2)
	// A day-long window first, so exactly three are admitted whatever the
	// machine's speed; then one-second windows.
	servicetest.ClearOfWindowEdge(t, 24*time.Hour, time.Minute)
	b.putSource(t, "billing", map[string]any{"rate_limit": 3, "rate_window": "24h"})

	all := ids("t", 9)
	b.postAll(t, "billing", "invoice.paid", all...)
	// Six of nine are deferred and scheduled.
	b.waitCount(t, 6, `SELECT count(*) FROM event_ingress_retries WHERE scheduled_attempt = 2`)
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
		b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE metadata->>'decided_by' = 'hold'`),
		"the window's end decided every retry time")
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND retry_count > 0`),
		"holds used no retry")
}

// A pause far longer than the whole retry budget (two retries, 100ms
// apart at most) exhausts nothing; the resume admits every held event
// at once (decided by the resume), not at the next backoff; how soon is
// the machine's speed, which bench hold-release measures.
func TestE2EResumeAdmitsHeldEventsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", map[string]any{"reason": "upgrade"}, nil))

	all := ids("p", 20)
	b.postAll(t, "crm", "contact.created", all...)
	b.waitCount(t, len(all), `SELECT count(*) FROM retries WHERE kind = 'event' AND state = 'scheduled' AND hold_reason = 'pause'`)
	// Outlast the retry budget several times over (on the database clock
	// the scheduler uses): a failure would have been exhausted by now.
	b.waitCount(t, 0, `SELECT count(*) FROM retries WHERE kind = 'event' AND held_since > now() - interval '1 second'`)
	require.Empty(t, b.admittedIDs(t))
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND (state <> 'scheduled' OR retry_count > 0)`))

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, nil))
	var resumedAt time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT updated_at FROM event_sources WHERE source = 'crm'`).Scan(&resumedAt))
	b.requireAdmittedOnce(t, all...)
	var lastAdmitted time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT max(admitted_at) FROM workflow_events WHERE source = 'crm'`).Scan(&lastAdmitted))
	// How soon is the machine's speed (bench hold-release measures it);
	// that the resume released them is the history's decided_by below.
	t.Logf("last held event admitted %s after the resume", lastAdmitted.Sub(resumedAt))
	for _, id := range all {
		require.Eventually(t, func() bool { return b.schedulerState(t, id) == "succeeded" }, eventually, 20*time.Millisecond, id)
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM workflow_events WHERE status = 'exhausted'`))
	h := b.count(t, `SELECT count(*) FROM retry_history WHERE kind = 'event' AND decided_by = 'resume'`)
	require.Equal(t, len(all), h, "each release is in the history")
	// Ingress admitted them itself, in exact arrival order (their INGEST
	// sequence, although the gate deferred them several at once), without
	// a due each.
	order := b.admissionOrder(t, "crm")
	requireNearOrder(t, "p-", order, 0)
	require.Empty(t, streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.due."))
}

// A pause with an end releases its held events at the end: each is
// decided due exactly at the pause's until, and admitted not before it.
// How soon after it is the machine's speed, which only the log reports.
func TestE2EPauseUntilAdmitsAtItsEnd(t *testing.T) {
	t.Parallel()
	all := ids("u", 3)
	b, until := heldByAPauseUntil(t, 3*time.Second, "crm", "contact.created", all, func() *bundle {
		b := setup(t)
		b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
		return b
	})
	rows, err := b.pool.Query(b.ctx, `SELECT event_id, admitted_at FROM workflow_events WHERE source = 'crm'`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		var at time.Time
		require.NoError(t, rows.Scan(&id, &at))
		require.False(t, at.Before(until), "%s admitted at %s, before the pause ended at %s", id, at, until)
		t.Logf("%s admitted %s after the pause ended", id, at.Sub(until))
	}
	require.NoError(t, rows.Err())
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND state = 'exhausted'`))
	require.Equal(t, len(all), b.count(t, `SELECT count(*) FROM retry_history WHERE kind = 'event' AND decided_by = 'pause_until' AND next_attempt_at = $1`, until),
		"each held event due exactly at the pause's end")
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

// setMaxHold sets the event policy's max_hold.
func (b *bundle) setMaxHold(t *testing.T, d time.Duration) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE retry_policies SET max_hold_ms = $1 WHERE kind = 'event' AND job_type = ''`, d.Milliseconds())
	require.NoError(t, err)
}

// Only the policy's max_hold ends a hold: the event is exhausted as
// hold_expired, with its retries unused.
func TestE2EHoldExpiresAfterMaxHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
	b.setMaxHold(t, 300*time.Millisecond)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", nil, nil))
	b.post(t, event("gone", "crm", "contact.created"))

	b.waitStatus(t, "exhausted", "gone")
	var v ingress.EventView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/events/gone", nil, &v))
	require.Equal(t, "exhausted", v.Retry.State)
	require.Equal(t, 2, v.Retry.Attempts, "held at arrival and when it came due at max_hold")
	require.Contains(t, v.Retry.LastError, "hold_expired")
	require.Contains(t, v.Retry.LastError, "after 0 retries")
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
	b.postAll(t, "billing", "invoice.paid", all...)
	b.waitCount(t, 6, `SELECT count(*) FROM workflow_events WHERE status <> 'received'`)
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
	// The window outlasts the test: the events stay held until the limit
	// is lifted after the purges, which releases them.
	b.withScheduler(t, 100*time.Millisecond, 2*time.Second, 50)
	servicetest.ClearOfWindowEdge(t, time.Hour, time.Minute)
	b.putSource(t, "billing", map[string]any{"rate_limit": 1, "rate_window": "1h"})
	all := ids("g", 4)
	b.postAll(t, "billing", "invoice.paid", all...)
	// Wait until the scheduler holds the deferrals, then lose RETRIES.
	b.waitCount(t, 3, `SELECT count(*) FROM event_ingress_retries WHERE scheduled_attempt > attempts`)
	s, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.NoError(t, s.Purge(b.ctx))
	// And INGEST, with every producer sending again.
	s, err = b.js.Stream(b.ctx, contract.StreamIngest)
	require.NoError(t, err)
	require.NoError(t, s.Purge(b.ctx))
	b.postAll(t, "billing", "invoice.paid", all...)
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
	b.setMaxHold(t, 300*time.Millisecond)
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

// A burst to a rate-limited source (docs/ingress.md, at a reduced size):
// every event is admitted once, in arrival order, at most the limit per
// window, and each held event comes back once, at its own slot, rather
// than every held event at every window edge.
func TestE2EThrottledBurstIsAdmittedInOrderOneDueEach(t *testing.T) {
	t.Parallel()
	// The default concurrency: the gate decides a source's events in
	// arrival order whatever it is.
	b := setup(t)
	b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
	const limit, n = 10, 60
	b.putSource(t, "stream", map[string]any{"rate_limit": limit, "rate_window": "1s"})
	all := ids("s", n)
	b.postAll(t, "stream", "tick.happened", all...)
	b.requireAdmittedOnce(t, all...)

	order := b.admissionOrder(t, "stream")
	require.Equal(t, all, order, "admitted in arrival order")
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_source_windows WHERE source = 'stream' AND admitted > $1`, limit))
	held := b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND source = 'stream'`)
	require.Positive(t, held)
	dues := len(streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.due."))
	require.LessOrEqual(t, float64(dues), 1.1*float64(held), "%d dues for %d held events", dues, held)
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND (state = 'exhausted' OR retry_count > 0)`))
}

// Held events whose dues all come late (the scheduler is down while their
// slots pass, as after a crash) keep their place in line: when it comes
// back they are admitted in arrival order, at most the limit per window,
// and a due that finds its window full waits for its turn instead of
// being held again (one due each, none at the back of the line). The wait
// is measured on the database clock: with the service's clock 5 minutes
// behind it, dues still come back at their turn, not 5 minutes later.
func TestE2ELateHoldersKeepTheirPlace(t *testing.T) {
	t.Parallel()
	for name, skew := range map[string]time.Duration{"clocks agree": 0, "service clock 5m behind": -5 * time.Minute} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testLateHoldersKeepTheirPlace(t, skew)
		})
	}
}

func testLateHoldersKeepTheirPlace(t *testing.T, skew time.Duration) {
	b := setup(t, func(c *ingress.Config) {
		c.Concurrency = 1
		c.Now = func() time.Time { return time.Now().Add(skew) }
	})
	const limit, n = 20, 60
	b.putSource(t, "late", map[string]any{"rate_limit": limit, "rate_window": "1s"})
	all := ids("l", n)
	b.postAll(t, "late", "tick.happened", all...)
	// The first window admits the limit (more when the gate is slow
	// enough that the window turns before the first event is held: every
	// later one then queues behind it).
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM workflow_events WHERE source = 'late' AND status IN ('admitted', 'deferred')`) == n
	}, eventually, 50*time.Millisecond)
	require.Positive(t, b.count(t, `SELECT count(*) FROM workflow_events WHERE source = 'late' AND status = 'deferred'`))
	// No scheduler yet: every slot passes with its due not sent.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM event_source_holds WHERE slot_at > now() - interval '500 milliseconds'`) == 0
	}, eventually, 100*time.Millisecond)

	b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
	b.requireAdmittedOnce(t, all...)
	order := b.admissionOrder(t, "late")
	// In arrival order, exactly: a due handed back to wait that comes back
	// more than 100 ms late is admitted by the holder behind it, ahead of
	// it (docs/ingress.md). (Before 2026-11-27 the line went on without
	// it, and with eight copies of this test at once on 2 cores events
	// landed up to 15 places off.)
	requireNearOrder(t, "l-", order, 0)
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_source_windows WHERE source = 'late' AND admitted > $1`, limit))
	dues := len(streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.due."))
	require.LessOrEqual(t, dues, n-limit, "one due per held event: waiting for a turn is not a new hold")
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND (state = 'exhausted' OR retry_count > 0)`))
}

// A resume of a paused source with a rate limit is paced (docs/ingress.md,
// at a reduced size): every held event comes back once, at its slot of the
// limit, in arrival order, and each window admits the limit: the release
// runs at the limit instead of waking every event at once. A newcomer sent
// during the release queues behind the line.
func TestE2EResumeUnderALimitIsPacedInArrivalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *ingress.Config) { c.Concurrency = 1 })
	b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
	const limit, n = 20, 100
	b.putSource(t, "paced", map[string]any{"rate_limit": limit, "rate_window": "200ms"})
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/paced/pause", map[string]any{"reason": "upgrade"}, nil))
	all := ids("r", n)
	b.postAll(t, "paced", "tick.happened", all...)
	b.waitCount(t, n, `SELECT count(*) FROM retries WHERE kind = 'event' AND state = 'scheduled' AND hold_reason = 'pause'`)

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/paced/resume", nil, nil))
	b.post(t, event("newcomer", "paced", "tick.happened"))
	b.requireAdmittedOnce(t, append(all, "newcomer")...)

	order := b.admissionOrder(t, "paced")
	require.Len(t, order, n+1)
	require.Equal(t, "newcomer", order[n], "the newcomer queues behind the line")
	// Ingress's releaser admits the line itself, one batch after another:
	// in arrival order, exactly.
	requireNearOrder(t, "r-", order[:n], 0)
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_source_windows WHERE source = 'paced' AND admitted > $1`, limit))
	// 100 events at 20 per 200 ms: five windows or so, not one.
	windows := b.count(t, `SELECT count(DISTINCT date_bin('200 milliseconds', admitted_at, 'epoch'::timestamptz)) FROM workflow_events WHERE source = 'paced'`)
	require.GreaterOrEqual(t, windows, n/limit, "paced over the windows")
	// No due for a released event (the newcomer, held behind the line,
	// has its own), and each retry closed by ingress's succeeded. Only the
	// newcomer's due may be handed back, to wait while the releaser
	// admits the line's last events (it passes a releaseTick apart).
	require.Empty(t, streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.due.r-"))
	require.LessOrEqual(t, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "paced", "event": "waited"}), 5.0)
	// The scheduler closes every released retry.
	b.waitCount(t, n, `SELECT count(*) FROM retries WHERE kind = 'event' AND item_id LIKE 'r-%' AND state = 'succeeded'`)
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND (state = 'exhausted' OR retry_count > 0)`))
	// The scheduler writes nothing on the released rows while ingress
	// admits them (its release runs behind, for fallbacks): each close
	// records the release, at the time ingress admitted the event.
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM retry_history WHERE kind = 'event' AND item_id LIKE 'r-%'
		AND event = 'succeeded' AND decided_by = 'resume'`), "each release is in the history")
	require.Zero(t, b.count(t, `SELECT count(*) FROM retry_history WHERE kind = 'event' AND item_id LIKE 'r-%' AND event = 'rescheduled'`),
		"no row written ahead of the owner")
}

// requireNearOrder checks that ids (prefix + sequence number) were
// admitted each within slack places of its place in arrival order.
func requireNearOrder(t *testing.T, prefix string, ids []string, slack int) {
	t.Helper()
	for i, id := range ids {
		seq, err := strconv.Atoi(strings.TrimPrefix(id, prefix))
		require.NoError(t, err, id)
		require.InDelta(t, i, seq, float64(slack), "%s admitted %d places from its place in line: %v", id, i-seq, ids)
	}
}

// requireInOrder requires ids (prefix and a sequence number) in sequence
// order but for at most outOfPlace of them: n minus the longest run in
// increasing order.
func requireInOrder(t *testing.T, prefix string, ids []string, outOfPlace int) {
	t.Helper()
	var tails []int // tails[k]: the least last number of an increasing run of k+1
	for _, id := range ids {
		seq, err := strconv.Atoi(strings.TrimPrefix(id, prefix))
		require.NoError(t, err, id)
		k, _ := slices.BinarySearch(tails, seq)
		if k == len(tails) {
			tails = append(tails, seq)
		} else {
			tails[k] = seq
		}
	}
	require.LessOrEqual(t, len(ids)-len(tails), outOfPlace, "events out of place: %v", ids)
}

// A pause with an until under a rate limit ends paced: each event held by
// the pause takes its slot of the limit from the pause's end, in arrival
// order, and comes back once, at its slot. None is admitted before the
// end.
func TestE2EPauseUntilUnderALimitEndsPacedInArrivalOrder(t *testing.T) {
	t.Parallel()
	// The default concurrency: the dues, several a millisecond apart,
	// come in batches of the scheduler's due loop, and each source's are
	// decided in the order they were emitted.
	const limit, n = 50, 200
	all := ids("u", n)
	b, until := heldByAPauseUntil(t, 2*time.Second, "until", "tick.happened", all, func() *bundle {
		b := setup(t)
		b.withScheduler(t, 50*time.Millisecond, 100*time.Millisecond, 2)
		b.putSource(t, "until", map[string]any{"rate_limit": limit, "rate_window": "100ms"})
		return b
	})

	require.Zero(t, b.count(t, `SELECT count(*) FROM workflow_events WHERE source = 'until' AND admitted_at < $1`, until),
		"none admitted before the pause's end")
	order := b.admissionOrder(t, "until")
	// In arrival order: exactly when the machine keeps up. A due handed
	// back that comes back more than 100 ms late is not waited for
	// (docs/ingress.md), so under load a few groups of events land a
	// little later (up to 12 of 200 with other builds running, 22 in CI's
	// make test); dues decided in parallel put 54 to 74 out of place
	// here, with less load.
	requireInOrder(t, "u-", order, n/5)
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_source_windows WHERE source = 'until' AND admitted > $1`, limit))
	windows := b.count(t, `SELECT count(DISTINCT date_bin('100 milliseconds', admitted_at, 'epoch'::timestamptz)) FROM workflow_events WHERE source = 'until'`)
	require.GreaterOrEqual(t, windows, n/limit, "paced over the windows")
	dues := len(streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.due."))
	require.LessOrEqual(t, float64(dues), 1.1*float64(n), "one due per held event, not one per window: %d dues", dues)
	require.Zero(t, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND (state = 'exhausted' OR retry_count > 0)`))
	// The scheduler closes each retry after ingress admits the event.
	b.waitCount(t, n, `SELECT count(*) FROM retries WHERE kind = 'event' AND state = 'succeeded'`)
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND hold_reason = 'pause' AND state = 'succeeded'`),
		"each was held by the pause")
}

// heldByAPauseUntil runs the start of a scenario about events a pause with
// an end holds: on a bundle from start, it pauses source until span from
// now, posts ids of type typ to it, and waits until each is admitted. It
// returns the bundle and the pause's end.
//
// The premise is that the gate decides every event while the pause lasts.
// The gate decides at its own pace (at the database's clock, a batch of a
// source in one transaction), and on a loaded machine it may decide the
// last events after an end chosen in advance: those are then held by the
// rate limit or admitted, rightly, and the scenario is not the one meant
// (make test under load: 100 of 200 events decided up to 2.3 s after a
// pause of 2 s ended, posted 1.4 s before it). So when an event's hold
// did not begin before the end, the scenario starts again on a new bundle
// with a pause twice as long. An event held for another reason before the
// end is the gate's fault; the caller's checks find it.
func heldByAPauseUntil(t *testing.T, span time.Duration, source, typ string, ids []string, start func() *bundle) (*bundle, time.Time) {
	t.Helper()
	const attempts = 4
	for attempt := 1; ; attempt++ {
		b := start()
		until := time.Now().Add(span).UTC().Truncate(time.Millisecond)
		require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/"+source+"/pause",
			map[string]any{"reason": "upgrade", "until": until.Format(time.RFC3339Nano)}, nil))
		b.postAll(t, source, typ, ids...)
		b.requireAdmittedOnce(t, ids...)
		// Each admitted event came back by its due, so its retry, with the
		// time its hold began (the gate's clock), is in place.
		held := b.count(t, `SELECT count(*) FROM retries WHERE kind = 'event' AND held_since < $1`, until)
		if held == len(ids) {
			return b, until
		}
		require.Less(t, attempt, attempts, "the gate decided %d of %d events after a pause of %s ended", len(ids)-held, len(ids), span)
		t.Logf("the gate decided %d of %d events after a pause of %s ended; again with a pause of %s", len(ids)-held, len(ids), span, 2*span)
		span *= 2
	}
}
