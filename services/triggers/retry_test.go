package triggers

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

func TestConcurrencyLimitAndRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	tr := b.createTrigger(t, TriggerInput{ID: "one-at-a-time", Name: "serial", Source: "crm", EventType: "lead.created",
		MaxConcurrency: new(1), Workflow: "enrich"})
	b.publishEvent(t, "crm", "lead.created", "l1", map[string]any{"n": 1})
	d1 := b.waitDelivery(t, DeliveryID("l1", tr.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusLaunched, d1.Status)
	b.publishEvent(t, "crm", "lead.created", "l2", map[string]any{"n": 2})
	id2 := DeliveryID("l2", tr.ID)
	d2 := b.waitDelivery(t, id2, func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusConcurrencyLimited, d2.Status)
	require.Equal(t, ReasonMaxConcurrency, d2.StatusReason)
	require.Nil(t, d2.NextAttemptAt, "no retry-after hint: the scheduler's backoff decides")
	f := findHeld(t, b, id2, 1)
	require.Equal(t, contract.HoldConcurrency, f.Reason)
	require.Nil(t, f.Until)

	// Still in flight: held again.
	b.publishDue(t, id2, 2, f.Payload)
	findHeld(t, b, id2, 2)

	// The run completes (twice: a redelivered completion), freeing the slot.
	done := b.publishRunFinished(t, "enrich", d1.RunID, contract.RunCompleted)
	b.republish(t, done)
	require.Eventually(t, func() bool {
		r, err := triggerstore.GetRun(b.ctx, b.pool, d1.RunID)
		return err == nil && r.Status == triggerstore.RunCompleted
	}, eventually, tick)
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.duplicates, ConsumerRuns) >= 1 }, eventually, tick)
	require.Equal(t, 1.0, counter(t, b.svc.metrics.runsFinished, tr.ID, "completed"))

	b.publishDue(t, id2, 3, f.Payload)
	d2 = b.waitDelivery(t, id2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	require.Equal(t, 2, d2.RetryAttempts)
	findLifecycle(t, b, contract.Succeeded, id2, 3)

	// A failed run asks the scheduler for a retry and keeps its slot
	// until the scheduler gives up on it.
	b.publishRunFinished(t, "enrich", d2.RunID, contract.RunFailed)
	require.Eventually(t, func() bool {
		r, err := triggerstore.GetRun(b.ctx, b.pool, d2.RunID)
		return err == nil && r.Status == triggerstore.RunRetrying
	}, eventually, tick)
	findLifecycleOf(t, b, contract.KindRun, contract.Failed, d2.RunID, 1)
	require.Equal(t, 1, b.inFlight(t, tr.ID))
	publishLifecycle(t, b, contract.Exhausted, contract.ExhaustedData{Kind: contract.KindRun, ID: d2.RunID, Attempt: 1,
		Reason: contract.ExhaustedNonRetryable, Error: contract.ErrorInfo{Message: "run failed"}, Policy: "workflow_run", PolicyVersion: 1})
	require.Eventually(t, func() bool {
		r, err := triggerstore.GetRun(b.ctx, b.pool, d2.RunID)
		return err == nil && r.Status == triggerstore.RunFailed
	}, eventually, tick)
	require.Zero(t, b.inFlight(t, tr.ID))

	// A run retryd did not launch is acknowledged and ignored.
	b.publishRunFinished(t, "enrich", "run-elsewhere", contract.RunCompleted)
	require.Equal(t, map[string]int{d1.RunID: 1, d2.RunID: 1}, b.requestedRuns(t))
	require.Equal(t, 2.0, counter(t, b.svc.metrics.concurrencyLimited, tr.ID))
}

// holdTwo creates a trigger with max concurrency 1 and returns the ids of
// one launched and two held deliveries.
func holdTwo(t *testing.T, b *bundle, triggerID, prefix string) (launched triggerstore.Delivery, held1, held2 string) {
	t.Helper()
	b.createTrigger(t, TriggerInput{ID: triggerID, Name: triggerID, Source: "crm", EventType: "lead." + triggerID,
		MaxConcurrency: new(1), Workflow: "enrich"})
	for i := 1; i <= 3; i++ {
		id := prefix + string(rune('0'+i))
		b.publishEvent(t, "crm", "lead."+triggerID, id, map[string]any{"i": i})
		b.waitDelivery(t, DeliveryID(id, triggerID), func(d triggerstore.Delivery) bool { return true })
	}
	return b.delivery(t, DeliveryID(prefix+"1", triggerID)), DeliveryID(prefix+"2", triggerID), DeliveryID(prefix+"3", triggerID)
}

func TestDueCancelsWhenTriggerOrEventIsGone(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	_, h1, h2 := holdTwo(t, b, "gone", "g")
	f1, f2 := findHeld(t, b, h1, 1), findHeld(t, b, h2, 1)

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/triggers/gone/disable", nil, nil))
	b.publishDue(t, h1, 2, f1.Payload)
	d := b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusCancelled })
	require.Equal(t, ReasonTriggerDisabled, d.StatusReason)
	require.Equal(t, triggerstore.RetryCancelled, d.RetryState)
	require.Equal(t, 2, d.TriggerVersion, "the disabled version decided")
	c := findLifecycle(t, b, contract.Cancelled, h1, 2)
	require.Equal(t, ReasonTriggerDisabled, c.Cancelled.Reason)

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/triggers/gone/enable", nil, nil))
	require.Equal(t, http.StatusNoContent, b.do(t, http.MethodDelete, "/v1/triggers/gone", nil, nil))
	b.publishDue(t, h2, 2, f2.Payload)
	d = b.waitDelivery(t, h2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusCancelled })
	require.Equal(t, ReasonTriggerDeleted, d.StatusReason)
	findLifecycle(t, b, contract.Cancelled, h2, 2)

	// A due for a delivery this database never had is cancelled too.
	b.publishDue(t, "NOSUCHDELIVERY", 4, nil)
	c = findLifecycle(t, b, contract.Cancelled, "NOSUCHDELIVERY", 4)
	require.Equal(t, ReasonDeliveryMissing, c.Cancelled.Reason)

	// Without a payload the event comes from triggers' own copy, kept when
	// the delivery was held (never from ingress's workflow_events); when
	// it is not there either, the delivery is cancelled.
	first, m1, m2 := holdTwo(t, b, "payloadless", "p")
	b.publishRunFinished(t, "enrich", first.RunID, contract.RunCompleted)
	b.waitSlotsFree(t, "payloadless")
	kept, err := triggerstore.GetEvent(b.ctx, b.pool, "p3")
	require.NoError(t, err)
	env, err := contract.DecodeEventMsg(kept)
	require.NoError(t, err)
	require.Equal(t, "p3", env.ID)
	_, err = b.pool.Exec(b.ctx, `DELETE FROM trigger_events WHERE event_id = 'p2'`)
	require.NoError(t, err)
	require.Zero(t, pgtest.Count(t, b.pool, `SELECT count(*) FROM workflow_events`), "this test has no ingress: nothing may come from its table")
	b.publishDue(t, m1, 2, nil)
	d = b.waitDelivery(t, m1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusCancelled })
	require.Equal(t, ReasonEventMissing, d.StatusReason)
	b.publishDue(t, m2, 2, nil)
	d = b.waitDelivery(t, m2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	require.Equal(t, RunID(m2), d.RunID)
	require.Equal(t, 1.0, counter(t, b.svc.metrics.cancelled, "gone", ReasonTriggerDisabled))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.cancelled, "payloadless", ReasonEventMissing))
}

func publishLifecycle(t *testing.T, b *bundle, ev contract.Lifecycle, data interface {
	Validate() error
}) *nats.Msg {
	t.Helper()
	msg := contracttest.LifecycleMsg(t, "test/scheduler", ev, data, time.Now())
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	return msg
}

func TestRetryColumnsFollowTheScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	_, h1, h2 := holdTwo(t, b, "cols", "c")
	next := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	sched := publishLifecycle(t, b, contract.Scheduled, contract.ScheduledData{Kind: contract.KindEventTrigger, ID: h1, Attempt: 2, NextAttemptAt: next,
		Decision: contract.Decision{Policy: "event-trigger", PolicyVersion: 1, DecidedBy: contract.DecidedByBackoff, DelayMS: 1000, MaxRetries: 20}})
	d := b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.ScheduledAttempt == 2 })
	require.True(t, d.NextAttemptAt.Equal(next))
	require.Equal(t, triggerstore.RetryScheduled, d.RetryState)
	require.Equal(t, "event-trigger", d.RetryMetadata["policy"])
	require.Equal(t, contract.DecidedByBackoff, d.RetryMetadata["decided_by"])

	exh := publishLifecycle(t, b, contract.Exhausted, contract.ExhaustedData{Kind: contract.KindEventTrigger, ID: h1, Attempt: 1,
		Reason: contract.ExhaustedMaxRetries, Error: contract.ErrorInfo{Class: "rate_limit"}, Policy: "event-trigger", PolicyVersion: 1})
	d = b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusExhausted })
	require.Equal(t, triggerstore.RetryExhausted, d.RetryState)
	require.Equal(t, contract.ExhaustedMaxRetries, d.StatusReason)
	require.Nil(t, d.NextAttemptAt)

	publishLifecycle(t, b, contract.Cancelled, contract.CancelledData{Kind: contract.KindEventTrigger, ID: h2, Attempt: 1, By: "operator", Reason: "not needed"})
	d = b.waitDelivery(t, h2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusCancelled })
	require.Equal(t, "cancelled_by_operator", d.StatusReason)
	require.Equal(t, "not needed", d.RetryMetadata["cancel_reason"])

	b.republish(t, sched)
	b.republish(t, exh)
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.duplicates, ConsumerRetryState) >= 2 }, eventually, tick)
	require.Equal(t, 1.0, counter(t, b.svc.metrics.exhausted, "cols"))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.cancelled, "cols", "cancelled_by_scheduler"))
	require.Equal(t, triggerstore.StatusExhausted, b.delivery(t, h1).Status)

	// A due the scheduler emitted before the operator's cancel does
	// nothing...
	payload := findHeld(t, b, h2, 1).Payload
	due := b.publishDue(t, h2, 2, payload)
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.duplicates, ConsumerRetry) == 1 }, eventually, tick)
	require.Equal(t, triggerstore.StatusCancelled, b.delivery(t, h2).Status)
	// ...until a manual retry reschedules the delivery: the due the
	// scheduler emits again then runs it (held again here: the first run
	// is still in flight).
	publishLifecycle(t, b, contract.Rescheduled, contract.ScheduledData{Kind: contract.KindEventTrigger, ID: h2, Attempt: 2, NextAttemptAt: time.Now(),
		Decision: contract.Decision{Policy: "event-trigger", DecidedBy: contract.DecidedByManual}})
	b.waitDelivery(t, h2, func(d triggerstore.Delivery) bool { return d.ScheduledAttempt == 2 })
	b.republish(t, due)
	findHeld(t, b, h2, 2)
	d = b.waitDelivery(t, h2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusConcurrencyLimited })
	require.Equal(t, 2, d.RetryAttempts)
}

func TestMalformedMessagesAreTerminatedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	tr := b.createTrigger(t, TriggerInput{ID: "t", Name: "t", Source: "billing", EventType: "invoice.paid", Workflow: "w"})
	raw := func(subject, body string) {
		msg := nats.NewMsg(subject)
		msg.Data = []byte(body)
		msg.Header.Set(contract.HeaderMsgID, contract.NewID())
		_, err := b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	raw("events.billing.invoice.paid", `{"not": "an envelope"`)
	raw("events.billing.invoice.paid", `[1,2,3]`)
	env := contract.Envelope{SpecVersion: contract.SpecVersion, ID: "x1", Source: "other", Type: "invoice.paid", Time: time.Now().UTC()}
	body, err := env.Marshal()
	require.NoError(t, err)
	raw("events.billing.invoice.paid", string(body)) // subject and envelope disagree
	raw("retry.event-trigger.due.D1", `{"specversion":"1.0"}`)
	raw("retry.event-trigger.scheduled.D1", `garbage`)
	raw("runs.w.completed.r1", `{}`)

	require.Eventually(t, func() bool {
		return counter(t, b.svc.metrics.malformed, ConsumerEvents) == 3 &&
			counter(t, b.svc.metrics.malformed, ConsumerRetry) == 1 &&
			counter(t, b.svc.metrics.malformed, ConsumerRetryState) == 1 &&
			counter(t, b.svc.metrics.malformed, ConsumerRuns) == 1
	}, eventually, tick)
	for _, c := range []struct{ stream, name string }{
		{contract.StreamEvents, ConsumerEvents}, {contract.StreamRetries, ConsumerRetry},
		{contract.StreamRetries, ConsumerRetryState}, {contract.StreamRuns, ConsumerRuns},
	} {
		b.settled(t, c.stream, c.name)
	}
	// The consumers keep going: a good event after the bad ones launches.
	b.publishEvent(t, "billing", "invoice.paid", "good", map[string]any{})
	d := b.waitDelivery(t, DeliveryID("good", tr.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusLaunched, d.Status)
	require.Empty(t, b.countDeliveries(t, "nope"))
}

func TestReconcileRepublishesUnconfirmedFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.ReconcileAfter = 2 * time.Second })
	_, h1, h2 := holdTwo(t, b, "recon", "r")
	findHeld(t, b, h1, 1)
	findHeld(t, b, h2, 1)
	publishLifecycle(t, b, contract.Scheduled, contract.ScheduledData{Kind: contract.KindEventTrigger, ID: h2, Attempt: 2,
		NextAttemptAt: time.Now().Add(time.Hour), Decision: contract.Decision{Policy: "event-trigger"}})
	b.waitDelivery(t, h2, func(d triggerstore.Delivery) bool { return d.ScheduledAttempt == 2 })
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)

	// The RETRIES stream is lost before the scheduler saw h1's failure.
	b.loseRetries(t)
	f := findHeld(t, b, h1, 1)
	require.Equal(t, contract.HoldConcurrency, f.Reason)
	require.Equal(t, "true", f.Metadata["reconciled"])
	require.Empty(t, b.lifecycle(t, contract.Scheduled))

	n, err := b.svc.Reconcile(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "a republished delivery waits ReconcileAfter again")
}

// A deleted consumer, or one lost with the RETRIES stream, is created
// again: due events published afterwards still reach held deliveries.
func TestDeletedConsumersAndStreamAreRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) {
		c.Streams = &streams.Options{}
		c.CheckInterval = 50 * time.Millisecond
	})
	launched, h1, h2 := holdTwo(t, b, "lost", "x")
	f1, f2 := findHeld(t, b, h1, 1), findHeld(t, b, h2, 1)
	b.publishRunFinished(t, "enrich", launched.RunID, contract.RunCompleted)
	b.waitSlotsFree(t, "lost")

	require.NoError(t, b.js.DeleteConsumer(b.ctx, contract.StreamRetries, ConsumerRetry))
	b.publishDue(t, h1, 2, f1.Payload)
	b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })

	require.NoError(t, b.js.DeleteStream(b.ctx, contract.StreamRetries))
	require.Eventually(t, func() bool {
		_, err := b.js.Consumer(b.ctx, contract.StreamRetries, ConsumerRetry)
		return err == nil
	}, eventually, tick, "the stream and its consumers are back")
	b.publishDue(t, h2, 2, f2.Payload)
	d := b.waitDelivery(t, h2, func(d triggerstore.Delivery) bool {
		return d.Status != triggerstore.StatusConcurrencyLimited || d.RetryAttempts == 2
	})
	require.Equal(t, 2, d.RetryAttempts, "the due was handled (held again: the first retry's run is in flight)")
}

// Text Postgres cannot store (a NUL byte, a UTF-8 sequence cut in two)
// in a valid lifecycle event or in an event's data must not wedge a
// message in an endless redelivery loop: the event is applied.
func TestUnstorableTextIsStillApplied(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	_, h1, h2 := holdTwo(t, b, "odd", "u")
	findHeld(t, b, h1, 1)
	findHeld(t, b, h2, 1)

	// 31 ASCII bytes then "é": cutting By at 32 bytes splits the "é".
	by := strings.Repeat("o", 31) + "é"
	publishLifecycle(t, b, contract.Cancelled, contract.CancelledData{Kind: contract.KindEventTrigger, ID: h1, Attempt: 1,
		By: by, Reason: "clean up"})
	d := b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusCancelled })
	require.True(t, utf8.ValidString(d.StatusReason), d.StatusReason)
	require.Equal(t, by, d.RetryMetadata["cancelled_by"])

	// A NUL in a decoded field cannot be stored: contract decoding refuses
	// the message, which is terminated and counted, and changes nothing.
	publishLifecycle(t, b, contract.Scheduled, contract.ScheduledData{Kind: contract.KindEventTrigger, ID: h2, Attempt: 2,
		NextAttemptAt: time.Now().Add(time.Hour), Decision: contract.Decision{Policy: "nul\x00policy"}})
	publishLifecycle(t, b, contract.Cancelled, contract.CancelledData{Kind: contract.KindEventTrigger, ID: h2, Attempt: 2,
		By: "op\x00erator", Reason: "nul\x00reason"})
	require.Eventually(t, func() bool {
		return servicetest.Metric(t, b.reg, "retryd_triggers_malformed_total", "consumer", ConsumerRetryState) == 2
	}, eventually, tick)
	d = b.waitDelivery(t, h2, func(triggerstore.Delivery) bool { return true })
	require.NotEqual(t, triggerstore.StatusCancelled, d.Status, "a refused message changes nothing")
	require.NotEqual(t, 2, d.ScheduledAttempt)

	// A throttle key with a NUL byte, from the event's data.
	tr := b.createTrigger(t, TriggerInput{ID: "keyed", Name: "keyed", Source: "crm", EventType: "lead.keyed",
		Throttle: &ThrottleInput{Limit: new(1), Window: "1h", Key: "data.customer"}, Workflow: "enrich"})
	b.publishEvent(t, "crm", "lead.keyed", "k1", map[string]any{"customer": "acme\x00"})
	b.publishEvent(t, "crm", "lead.keyed", "k2", map[string]any{"customer": "acme\x00"})
	b.publishEvent(t, "crm", "lead.keyed", "k3", map[string]any{"customer": "acme"})
	k1 := b.waitDelivery(t, DeliveryID("k1", tr.ID), func(triggerstore.Delivery) bool { return true })
	k2 := b.waitDelivery(t, DeliveryID("k2", tr.ID), func(triggerstore.Delivery) bool { return true })
	k3 := b.waitDelivery(t, DeliveryID("k3", tr.ID), func(triggerstore.Delivery) bool { return true })
	require.ElementsMatch(t, []triggerstore.Status{triggerstore.StatusLaunched, triggerstore.StatusThrottled},
		[]triggerstore.Status{k1.Status, k2.Status}, "the same key shares one budget")
	require.Equal(t, triggerstore.StatusLaunched, k3.Status, "another key has its own budget")
	require.Equal(t, k1.ThrottleKey, k2.ThrottleKey)
	require.NotContains(t, k1.ThrottleKey, "\x00")
}

// settled waits until a consumer of the service has nothing left to do.
func (b *bundle) settled(t *testing.T, stream, name string) {
	t.Helper()
	require.Eventually(t, func() bool { return natstest.Settled(t, b.ctx, b.js, stream, name) },
		eventually, tick, "consumer %s has messages left", name)
}

// Only a manual retry reopens a cancelled delivery: the confirmation of
// the attempt that was pending when an operator cancelled it, applied
// after the cancellation (the consumer's workers run in parallel), must
// not, or the due that was already on its way would launch it.
func TestLateConfirmationDoesNotReopenACancel(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	launched, h1, _ := holdTwo(t, b, "late", "l")
	f1 := findHeld(t, b, h1, 1)
	b.publishRunFinished(t, "enrich", launched.RunID, contract.RunCompleted)
	b.waitSlotsFree(t, "late")

	publishLifecycle(t, b, contract.Cancelled, contract.CancelledData{Kind: contract.KindEventTrigger, ID: h1, Attempt: 2, By: "alice"})
	b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusCancelled })
	publishLifecycle(t, b, contract.Scheduled, contract.ScheduledData{Kind: contract.KindEventTrigger, ID: h1, Attempt: 2,
		NextAttemptAt: time.Now(), Decision: contract.Decision{Policy: "event-trigger", DecidedBy: contract.DecidedByBackoff}})
	b.settled(t, contract.StreamRetries, ConsumerRetryState)
	b.publishDue(t, h1, 2, f1.Payload)
	b.settled(t, contract.StreamRetries, ConsumerRetry)
	d := b.delivery(t, h1)
	require.Equal(t, triggerstore.StatusCancelled, d.Status)
	require.Empty(t, d.RunID)

	// A manual retry does reopen it.
	publishLifecycle(t, b, contract.Rescheduled, contract.ScheduledData{Kind: contract.KindEventTrigger, ID: h1, Attempt: 3,
		NextAttemptAt: time.Now(), Decision: contract.Decision{Policy: "event-trigger", DecidedBy: contract.DecidedByManual}})
	b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.ScheduledAttempt == 3 })
	b.publishDue(t, h1, 3, f1.Payload)
	b.waitDelivery(t, h1, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
}
