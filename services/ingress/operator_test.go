package ingress_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

func TestSourcesAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)

	v := b.putSource(t, "billing", map[string]any{"rate_limit": 100, "rate_window": "1m", "allowed_types": []string{"invoice.paid", "invoice.voided"}})
	require.Equal(t, 100, *v.RateLimit)
	require.Equal(t, "1m0s", v.RateWindow)
	require.EqualValues(t, 60000, v.RateWindowMS)
	require.Equal(t, []string{"invoice.paid", "invoice.voided"}, v.AllowedTypes)
	require.Equal(t, "local", v.UpdatedBy, "the principal's name")

	var got ingress.SourceView
	require.Equal(t, 200, b.do(t, http.MethodGet, "/v1/sources/billing", nil, &got))
	require.Equal(t, v.RateLimit, got.RateLimit)
	var list struct{ Sources []ingress.SourceView }
	require.Equal(t, 200, b.do(t, http.MethodGet, "/v1/sources", nil, &list))
	require.Len(t, list.Sources, 1)

	var e apiError
	bad := []struct {
		path  string
		body  any
		field string
	}{
		{"/v1/sources/billing", map[string]any{"rate_limit": 5}, "rate_window"},
		{"/v1/sources/billing", map[string]any{"rate_window": "1s"}, "rate_window"},
		{"/v1/sources/billing", map[string]any{"rate_limit": 0, "rate_window": "1s"}, "rate_limit"},
		{"/v1/sources/billing", map[string]any{"rate_limit": 5, "rate_window": "soon"}, "rate_window"},
		{"/v1/sources/billing", map[string]any{"allowed_types": []string{"Invoice Paid"}}, "allowed_types[0]"},
		{"/v1/sources/billing", map[string]any{"limit": 5}, "limit"},
		{"/v1/sources/Bad%20Source", map[string]any{}, "source"},
	}
	for _, c := range bad {
		require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPut, c.path, c.body, &e), c.field)
		require.Equal(t, c.field, e.Error.Field)
	}
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/sources/none", nil, &e))
	require.Equal(t, "not_found", e.Error.Code)
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPost, "/v1/sources/none/resume", nil, &e))
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/sources/billing/pause",
		map[string]any{"until": time.Now().Add(-time.Minute)}, &e))
	require.Equal(t, "until", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/sources/billing/pause", `{"until":"tomorrow"}`, &e))

	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/sources/billing/pause", map[string]any{"until": until, "reason": "invoicing run"}, &got))
	require.True(t, got.Paused)
	require.True(t, until.Equal(*got.PausedUntil))
	require.Equal(t, "invoicing run", got.PauseReason)
	got = b.putSource(t, "billing", map[string]any{})
	require.True(t, got.Paused, "PUT keeps the pause")
	require.Nil(t, got.RateLimit)
	require.Empty(t, got.AllowedTypes)
	var resumed ingress.SourceView
	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/sources/billing/resume", nil, &resumed))
	require.False(t, resumed.Paused)
	require.Nil(t, resumed.PausedUntil)
}

func TestCancelDeferral(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.throttled(t, "billing", "invoice.paid", "ok", "held")

	var v ingress.EventView
	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/events/held/cancel", map[string]any{"reason": "duplicate order"}, &v))
	require.Equal(t, "cancelled", v.Status)
	require.Equal(t, "cancelled", v.Retry.State)
	require.Equal(t, "local", v.Retry.Metadata["cancelled_by"], "the principal's name")
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "held")[contract.Cancelled]) == 1 }, eventually, 20*time.Millisecond)
	cd := b.lifecycle(t, "held")[contract.Cancelled][0].Cancelled
	require.Equal(t, 1, cd.Attempt)
	require.Equal(t, "local", cd.By)
	require.Equal(t, "duplicate order", cd.Reason)

	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/events/held/cancel", nil, &v), "cancelling again is a no-op")
	var e apiError
	require.Equal(t, http.StatusConflict, b.do(t, http.MethodPost, "/v1/events/ok/cancel", nil, &e))
	require.Contains(t, e.Error.Message, "admitted")
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPost, "/v1/events/none/cancel", nil, &e))
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events/held/cancel", `{"why":1}`, &e))
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/events/none", nil, &e))
	// One audit entry: the cancel that changed something, by the
	// principal; not the no-op, the conflict, the missing or the invalid.
	entries := pgtest.Strings(t, b.pool, `SELECT principal || ' ' || action || ' ' || target || ' ' || (detail->>'reason')
		FROM audit_log WHERE action = 'event.cancel' ORDER BY id`)
	require.Equal(t, []string{"local event.cancel event/held duplicate order"}, entries)

	// A due that was already on its way, even with the limit lifted, never
	// admits a cancelled event; it republishes the cancellation (same
	// Nats-Msg-Id, so RETRIES keeps one).
	b.putSource(t, "billing", map[string]any{})
	b.publishDue(t, "held", "billing", 2)
	b.drained(t, ingress.ConsumerRetry)
	require.Equal(t, "cancelled", b.status(t, "held"))
	require.NotContains(t, b.admittedIDs(t), "held")
	require.Len(t, b.lifecycle(t, "held")[contract.Cancelled], 1)
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "cancelled"}))
}

func TestRetryStateFollowsTheScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.throttled(t, "billing", "invoice.paid", "ok", "x", "c")

	publish := func(msg *nats.Msg, err error) {
		t.Helper()
		require.NoError(t, err)
		_, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	now := time.Now()
	publish(contract.NewLifecycleMsg("test/scheduler", contract.Exhausted, contract.ExhaustedData{Kind: "event", ID: "x", Attempt: 1,
		Reason: contract.ExhaustedMaxRetries, Error: contract.ErrorInfo{Class: "rate_limit"}, RetryCount: 20, MaxRetries: 20,
		Policy: "event-ingress", PolicyVersion: 1, Source: "billing"}, now))
	publish(contract.NewLifecycleMsg("test/scheduler", contract.Cancelled, contract.CancelledData{Kind: "event", ID: "c", Attempt: 1,
		By: "alice", Reason: "not needed"}, now))
	// Late facts about an admitted event change nothing.
	publish(contract.NewLifecycleMsg("test/scheduler", contract.Exhausted, contract.ExhaustedData{Kind: "event", ID: "ok", Attempt: 1,
		Reason: contract.ExhaustedMaxRetries, Policy: "event-ingress", PolicyVersion: 1}, now))
	b.waitStatus(t, "exhausted", "x")
	b.waitStatus(t, "cancelled", "c")
	b.drained(t, ingress.ConsumerRetryState)
	require.Equal(t, "admitted", b.status(t, "ok"))

	var v ingress.EventView
	require.Equal(t, 200, b.do(t, http.MethodGet, "/v1/events/x", nil, &v))
	require.Equal(t, "exhausted", v.Retry.State)
	require.Contains(t, v.Retry.LastError, "max_retries")
	require.Equal(t, 200, b.do(t, http.MethodGet, "/v1/events/c", nil, &v))
	require.Equal(t, "cancelled", v.Retry.State)
	require.Equal(t, "alice", v.Retry.Metadata["cancelled_by"])
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "exhausted"}))
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "cancelled"}))

	// A due after the scheduler's cancellation: nothing is published.
	b.publishDue(t, "c", "billing", 2)
	b.drained(t, ingress.ConsumerRetry)
	require.Len(t, b.lifecycle(t, "c")[contract.Cancelled], 1)
	require.NotContains(t, b.admittedIDs(t), "c")
}

// Text Postgres cannot store (a NUL byte) in a valid lifecycle event is
// still applied, not redelivered forever; in an operator's request it is
// a 400 naming the field, not a 500.
func TestUnstorableText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.throttled(t, "billing", "invoice.paid", "ok", "s", "c")

	// A NUL in a decoded field cannot be stored: contract decoding refuses
	// the message, which is terminated and counted, and changes nothing.
	msg, err := contract.NewLifecycleMsg("test/scheduler", contract.Scheduled, contract.ScheduledData{Kind: "event", ID: "s", Attempt: 2,
		NextAttemptAt: time.Now().Add(time.Hour), Source: "billing",
		Decision: contract.Decision{Policy: "event\x00ingress", DecidedBy: "back\x00off"}}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	msg, err = contract.NewLifecycleMsg("test/scheduler", contract.Cancelled, contract.CancelledData{Kind: "event", ID: "c", Attempt: 1,
		By: "al\x00ice", Reason: "not\x00needed"}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.counter(t, "retryd_ingress_malformed_total", map[string]string{"consumer": ingress.ConsumerRetryState}) == 2
	}, eventually, 20*time.Millisecond)
	b.drained(t, ingress.ConsumerRetryState)
	require.Equal(t, "deferred", b.status(t, "c"), "a refused message changes nothing")
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_ingress_retries WHERE event_id = 's' AND scheduled_attempt = 2`))

	var e apiError
	for _, c := range []struct{ path, body, field string }{
		{"/v1/sources/billing/pause", `{"reason":"nul\u0000"}`, "reason"},
		{"/v1/events/s/cancel", `{"reason":"nul\u0000"}`, "reason"},
	} {
		require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, c.path, c.body, &e), c.path+" "+c.body)
		require.Equal(t, c.field, e.Error.Field)
	}
	require.Equal(t, "deferred", b.status(t, "s"), "a refused request changes nothing")
}

// publishManualRetry publishes what the scheduler publishes for an
// operator's manual retry of attempt: rescheduled, decided by "manual".
func (b *bundle) publishManualRetry(t *testing.T, id string, attempt int) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test/scheduler", contract.Rescheduled, contract.ScheduledData{
		Kind: contract.KindEvent, ID: id, Attempt: attempt, NextAttemptAt: time.Now(), Source: "crm",
		Decision: contract.Decision{Policy: "event-ingress", PolicyVersion: 1, DecidedBy: contract.DecidedByManual},
	}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

// A manual retry's due may arrive before the rescheduled event that
// reopens the ended deferral: it is handed back until the deferral is
// reopened, or, once ingress gave up waiting, it is not remembered as
// handled and the scheduler's re-emission of the same due admits the event.
// Confirmations that are not manual retries, or not newer than what the
// deferral knows, reopen nothing.
func TestManualRetryDueBeforeItsConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/pause", nil, nil))
	ended := []string{"quick", "slow", "old"}
	for _, id := range append(ended, "late") {
		b.post(t, event(id, "crm", "contact.created"))
	}
	b.waitStatus(t, "deferred", "quick", "slow", "old", "late")
	for _, id := range ended {
		msg, err := contract.NewLifecycleMsg("test/scheduler", contract.Exhausted, contract.ExhaustedData{Kind: "event", ID: id, Attempt: 1,
			Reason: contract.ExhaustedMaxRetries, Policy: "event-ingress", PolicyVersion: 1, Source: "crm"}, time.Now())
		require.NoError(t, err)
		_, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	b.waitStatus(t, "exhausted", ended...)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/events/late/cancel", nil, nil))
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, nil))

	// The due first, its confirmation a moment later.
	_, err := b.js.PublishMsg(b.ctx, dueMsg(t, "quick", "crm", 2))
	require.NoError(t, err)
	b.publishManualRetry(t, "quick", 2)
	b.waitStatus(t, "admitted", "quick")

	// The due alone: handed back a few times, then acked unclaimed.
	due := dueMsg(t, "slow", "crm", 2)
	_, err = b.js.PublishMsg(b.ctx, due)
	require.NoError(t, err)
	b.drained(t, ingress.ConsumerRetry)
	require.Equal(t, "exhausted", b.status(t, "slow"), "no confirmation: the due changes nothing")
	b.publishManualRetry(t, "slow", 2)
	b.publishManualRetry(t, "old", 1)
	b.publishScheduled(t, contract.Scheduled, "late", "crm", 2, time.Now())
	b.waitStatus(t, "deferred", "slow")
	b.drained(t, ingress.ConsumerRetryState)
	require.Equal(t, "exhausted", b.status(t, "old"), "a replayed confirmation reopens nothing")
	require.Equal(t, "cancelled", b.status(t, "late"), "a late confirmation of the pending attempt does not undo a cancel")
	// The scheduler emits the due again, with the same Nats-Msg-Id.
	b.shrinkDuplicateWindow(t, contract.StreamRetries)
	b.publishStored(t, due)
	b.waitStatus(t, "admitted", "slow")
	for _, id := range []string{"quick", "slow"} {
		// The succeeded fact goes out through the outbox after the
		// admission commits: wait for it, then count it.
		require.Eventually(t, func() bool { return len(b.lifecycle(t, id)[contract.Succeeded]) >= 1 }, eventually, 20*time.Millisecond, id)
		require.Len(t, b.lifecycle(t, id)[contract.Succeeded], 1, id)
		require.Equal(t, 1, b.admittedIDs(t)[id], id)
	}
}
