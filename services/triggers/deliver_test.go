package triggers

import (
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

func TestDeliveriesLaunchFilterAndSurviveRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	big := b.createTrigger(t, TriggerInput{ID: "big-invoices", Name: "big", Source: "billing", EventType: "invoice.paid",
		Predicate: "data.amount > 100", Workflow: "onboard"})
	b.createTrigger(t, TriggerInput{ID: "off", Name: "off", Source: "billing", EventType: "invoice.paid", Workflow: "onboard", Enabled: new(false)})
	b.createTrigger(t, TriggerInput{ID: "voided", Name: "voided", Source: "billing", EventType: "invoice.voided", Workflow: "refund"})

	e1 := b.publishEvent(t, "billing", "invoice.paid", "e1", map[string]any{"amount": 250})
	b.publishEvent(t, "billing", "invoice.paid", "e2", map[string]any{"amount": 5})
	b.publishEvent(t, "billing", "invoice.paid", "e3", map[string]any{"amount": "lots"})

	d1 := b.waitDelivery(t, DeliveryID("e1", big.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusLaunched, d1.Status)
	require.Equal(t, RunID(d1.ID), d1.RunID)
	require.Equal(t, 1, d1.TriggerVersion)
	require.NotNil(t, d1.LaunchedAt)
	require.Equal(t, triggerstore.RetryNone, d1.RetryState)
	d2 := b.waitDelivery(t, DeliveryID("e2", big.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusFiltered, d2.Status)
	require.Equal(t, ReasonPredicateFalse, d2.StatusReason)
	d3 := b.waitDelivery(t, DeliveryID("e3", big.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusFiltered, d3.Status)
	require.Equal(t, ReasonPredicateError, d3.StatusReason, "a string amount cannot be compared with 100")
	require.Empty(t, b.countDeliveries(t, "off"), "disabled triggers get no deliveries")
	require.Empty(t, b.countDeliveries(t, "voided"), "other event types get no deliveries")

	require.Eventually(t, func() bool { return len(b.requestedRuns(t)) == 1 }, eventually, tick)
	msgs := b.streamMsgs(t, contract.StreamRuns, "runs.*.requested.*")
	require.Len(t, msgs, 1)
	require.Equal(t, "runs.onboard.requested."+d1.RunID, msgs[0].Subject())
	require.Equal(t, "run-requested:"+d1.RunID, msgs[0].Headers().Get(contract.HeaderMsgID))
	_, req, err := contract.DecodeRunRequested(msgs[0].Subject(), msgs[0].Data())
	require.NoError(t, err)
	require.Equal(t, contract.RunRequestedData{RunID: d1.RunID, Workflow: "onboard", TriggerID: big.ID, TriggerVersion: 1,
		DeliveryID: d1.ID, EventID: "e1", Event: req.Event}, req)
	embedded, err := contract.DecodeEventMsg(req.Event)
	require.NoError(t, err)
	require.Equal(t, e1.ID, embedded.ID)
	require.JSONEq(t, `{"amount": 250}`, string(embedded.Data))

	// The same event delivered again (a redelivery JetStream's duplicate
	// window cannot catch) changes nothing.
	msg, err := contract.NewEventMsg(contract.EventSubject("billing", "invoice.paid"), e1)
	require.NoError(t, err)
	b.republish(t, msg)
	b.republish(t, msg)
	require.Eventually(t, func() bool {
		return counter(t, b.svc.metrics.duplicates, ConsumerEvents) >= 2
	}, eventually, tick)
	require.Equal(t, map[string]int{d1.RunID: 1}, b.requestedRuns(t))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.launched, big.ID))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.filtered, big.ID, ReasonPredicateFalse))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.filtered, big.ID, ReasonPredicateError))

	// A delivery records the version it was evaluated with.
	in := TriggerInput{Name: "big", Source: "billing", EventType: "invoice.paid", Predicate: "data.amount > 1000", Workflow: "onboard"}
	var v TriggerView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/"+big.ID, in, &v))
	require.Equal(t, 2, v.Version)
	b.publishEvent(t, "billing", "invoice.paid", "e4", map[string]any{"amount": 250})
	d4 := b.waitDelivery(t, DeliveryID("e4", big.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, 2, d4.TriggerVersion)
	require.Equal(t, triggerstore.StatusFiltered, d4.Status)
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)
}

// findHeld waits for the held event of a delivery's attempt: throttles
// and concurrency limits hold a delivery, they do not fail it.
func findHeld(t *testing.T, b *bundle, deliveryID string, attempt int) *contract.HeldData {
	t.Helper()
	var found *contract.HeldData
	require.Eventually(t, func() bool {
		for _, f := range b.lifecycle(t, contract.Held) {
			if f.ID == deliveryID && f.Held.Attempt == attempt {
				found = f.Held
				return true
			}
		}
		return false
	}, eventually, tick, "held event of %s attempt %d", deliveryID, attempt)
	return found
}

func findLifecycle(t *testing.T, b *bundle, ev contract.Lifecycle, deliveryID string, attempt int) contract.LifecycleEvent {
	t.Helper()
	return findLifecycleOf(t, b, contract.KindEventTrigger, ev, deliveryID, attempt)
}

func findLifecycleOf(t *testing.T, b *bundle, kind string, ev contract.Lifecycle, deliveryID string, attempt int) contract.LifecycleEvent {
	t.Helper()
	var found contract.LifecycleEvent
	require.Eventually(t, func() bool {
		for _, e := range b.lifecycleOf(t, kind, ev) {
			if e.ID == deliveryID && e.Attempt() == attempt {
				found = e
				return true
			}
		}
		return false
	}, eventually, tick, "%s event of %s attempt %d", ev, deliveryID, attempt)
	return found
}

func TestThrottleHoldsAndRetryLaunches(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	tr := b.createTrigger(t, TriggerInput{ID: "per-customer", Name: "per customer", Source: "shop", EventType: "order.placed",
		Throttle: &ThrottleInput{Limit: new(2), Window: "1h", Key: "data.customer"}, Workflow: "fulfil"})
	for _, e := range []struct{ id, customer string }{{"a1", "a"}, {"a2", "a"}, {"b1", "b"}} {
		b.publishEvent(t, "shop", "order.placed", e.id, map[string]any{"customer": e.customer})
		d := b.waitDelivery(t, DeliveryID(e.id, tr.ID), func(d triggerstore.Delivery) bool { return true })
		require.Equal(t, triggerstore.StatusLaunched, d.Status, e.id)
		require.Equal(t, e.customer, d.ThrottleKey)
	}
	b.publishEvent(t, "shop", "order.placed", "a3", map[string]any{"customer": "a"})
	a1 := b.delivery(t, DeliveryID("a1", tr.ID))
	a2 := b.delivery(t, DeliveryID("a2", tr.ID))
	a3ID := DeliveryID("a3", tr.ID)
	a3 := b.waitDelivery(t, a3ID, func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusThrottled, a3.Status)
	require.Equal(t, ReasonThrottled, a3.StatusReason)
	require.Equal(t, "a", a3.ThrottleKey)
	require.Equal(t, triggerstore.RetryScheduled, a3.RetryState)
	require.Equal(t, 1, a3.RetryAttempts)
	oldest := *a1.LaunchedAt
	if a2.LaunchedAt.Before(oldest) {
		oldest = *a2.LaunchedAt
	}
	reset := oldest.Add(time.Hour)
	require.True(t, a3.NextAttemptAt.Equal(reset), "the window resets when the oldest launch leaves it: %s vs %s", a3.NextAttemptAt, reset)
	require.Equal(t, ReasonThrottled, a3.RetryMetadata["reason"])

	f := findHeld(t, b, a3ID, 1)
	require.Equal(t, contract.HoldThrottle, f.Reason)
	require.NotNil(t, f.Until)
	require.True(t, f.Until.Equal(reset))
	require.Equal(t, "shop", f.Source)
	require.Equal(t, tr.ID, f.Metadata["trigger_id"])
	payload := f.Payload
	require.NotEmpty(t, payload, "the event rides along for the retry")

	// Due before the window reset: held again, attempt 2 failed. The
	// delivery's own throttled record does not count against it: with two
	// launches in the window it is held by those, not by itself.
	due2 := b.publishDue(t, a3ID, 2, payload)
	f2 := findHeld(t, b, a3ID, 2)
	require.Equal(t, contract.HoldThrottle, f2.Reason)
	a3 = b.waitDelivery(t, a3ID, func(d triggerstore.Delivery) bool { return d.RetryAttempts == 2 })
	require.Equal(t, triggerstore.StatusThrottled, a3.Status)

	// Shrink the window: the next attempt is evaluated with version 2 and
	// launches.
	var v TriggerView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/"+tr.ID, TriggerInput{Name: "per customer", Source: "shop", EventType: "order.placed",
		Throttle: &ThrottleInput{Limit: new(2), Window: "10ms", Key: "data.customer"}, Workflow: "fulfil"}, &v))
	require.Equal(t, 2, v.Version)
	due3 := b.publishDue(t, a3ID, 3, payload)
	a3 = b.waitDelivery(t, a3ID, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	require.Equal(t, 2, a3.TriggerVersion)
	require.Equal(t, triggerstore.RetryCompleted, a3.RetryState)
	require.Equal(t, 2, a3.RetryAttempts)
	require.Nil(t, a3.NextAttemptAt)
	ok := findLifecycle(t, b, contract.Succeeded, a3ID, 3)
	require.Equal(t, a3.RunID, ok.Succeeded.Metadata["run_id"])

	// Dues delivered again, and a stale one, change nothing.
	b.republish(t, due3)
	b.republish(t, due2)
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.duplicates, ConsumerRetry) >= 2 }, eventually, tick)
	runs := b.requestedRuns(t)
	require.Len(t, runs, 4)
	for id, n := range runs {
		require.Equal(t, 1, n, id)
	}
	require.Equal(t, 2.0, counter(t, b.svc.metrics.throttled, tr.ID))
	require.Equal(t, 2.0, counter(t, b.svc.metrics.retried, tr.ID))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.retrySucceeded, tr.ID))
	require.Equal(t, 4.0, counter(t, b.svc.metrics.launched, tr.ID))
}

// Logs never carry event data, not even at debug level in the reason a
// predicate or a throttle key failed (CEL quotes the values it rejects).
func TestLogsCarryNoEventData(t *testing.T) {
	t.Parallel()
	var logs servicetest.Buffer
	b := setup(t, true, func(c *Config) { c.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel) })
	tr := b.createTrigger(t, TriggerInput{ID: "dated", Name: "dated", Source: "pay", EventType: "card.used",
		Predicate: `timestamp(data.card) > timestamp("2020-01-01T00:00:00Z")`, Workflow: "w"})
	keyed := b.createTrigger(t, TriggerInput{ID: "keyed", Name: "keyed", Source: "pay", EventType: "card.used",
		Throttle: &ThrottleInput{Limit: new(5), Window: "1m", Key: `string(timestamp(data.card))`}, Workflow: "w"})
	b.publishEvent(t, "pay", "card.used", "c1", map[string]any{"card": "4111-1111-secret"})
	d := b.waitDelivery(t, DeliveryID("c1", tr.ID), func(triggerstore.Delivery) bool { return true })
	require.Equal(t, ReasonPredicateError, d.StatusReason)
	d = b.waitDelivery(t, DeliveryID("c1", keyed.ID), func(triggerstore.Delivery) bool { return true })
	require.Equal(t, ReasonThrottleKeyError, d.StatusReason)
	require.Contains(t, logs.String(), `"event_id":"c1"`)
	require.NotContains(t, logs.String(), "secret")
}

// A trigger on a URI-reference source matches its events (events carry
// the source's key in their subject), and its predicate reads the
// event's extension attributes.
func TestTriggerOnAURISourceReadsExtensions(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	const shop = "https://shop.example.com/orders"
	tr := b.createTrigger(t, TriggerInput{ID: "uri-source", Name: "uri", Source: shop, EventType: "order.created",
		Predicate: `event.extensions.partitionkey == "vip"`, Workflow: "onboard"})
	require.Equal(t, contract.SourceKey(shop), tr.Source, "the trigger keeps the source's key")
	for id, key := range map[string]string{"u-vip": "vip", "u-std": "std"} {
		env := contract.Envelope{SpecVersion: contract.SpecVersion, ID: id, Source: shop, Type: "order.created",
			Time: time.Now().UTC(), Extensions: map[string]any{"partitionkey": key}}
		msg, err := contract.NewEventMsg(contract.EventSubject(shop, "order.created"), env)
		require.NoError(t, err)
		_, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	vip := b.waitDelivery(t, DeliveryID("u-vip", tr.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusLaunched, vip.Status)
	std := b.waitDelivery(t, DeliveryID("u-std", tr.ID), func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusFiltered, std.Status)
}
