package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// An order whose warehouse fails twice is retried by the scheduler with
// the order policy's backoff (200 ms, then 400 ms), each due bringing the
// order back, and the third attempt ships it, once.
func TestFailedOrderIsRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	e.scheduler(t)
	e.orders(t, config{})
	order := Order{OrderID: "ord-backoff", SKU: "lamp", Qty: 2, FailFirst: 2}
	e.place(t, order)

	succeeded := e.waitFact(t, order.OrderID, contract.Succeeded, 3)
	facts := e.facts(t, order.OrderID)
	failed := only(facts, contract.Failed)
	require.Len(t, failed, 2, "facts: %v", facts)
	for i, f := range failed {
		require.Equal(t, i+1, f.Attempt())
		require.Equal(t, "temporary", f.Failed.Error.Class)
		require.Equal(t, "warehouse api: 503 service unavailable", f.Failed.Error.Message)
		requireOrder(t, order, f.Failed.Payload)
	}

	// The decisions say why each retry waited: the policy's backoff.
	scheduled, rescheduled := only(facts, contract.Scheduled), only(facts, contract.Rescheduled)
	require.Len(t, scheduled, 1, "facts: %v", facts)
	require.Len(t, rescheduled, 1, "facts: %v", facts)
	for i, d := range []*contract.ScheduledData{scheduled[0].Scheduled, rescheduled[0].Scheduled} {
		delay := int64(baseDelay/time.Millisecond) << i
		require.Equal(t, i+2, d.Attempt)
		require.Equal(t, "orders", d.Decision.Policy)
		require.Equal(t, contract.DecidedByBackoff, d.Decision.DecidedBy)
		require.Equal(t, "temporary", d.Decision.ErrorClass)
		require.Equal(t, delay, d.Decision.BaseDelayMS)
		require.Zero(t, d.Decision.JitterMS)
		require.Equal(t, delay, d.Decision.DelayMS)
		require.Equal(t, i+1, d.Decision.RetryCount)
		require.Equal(t, 5, d.Decision.MaxRetries)
	}

	// Each due brought the order back at the time its decision set, and
	// the attempt it asked for ran no earlier.
	dues := only(facts, contract.Due)
	require.Len(t, dues, 2, "facts: %v", facts)
	ran := []fact{failed[1], succeeded}
	for i, d := range dues {
		decided := []*contract.ScheduledData{scheduled[0].Scheduled, rescheduled[0].Scheduled}[i]
		require.Equal(t, i+2, d.Attempt())
		require.True(t, d.Due.NextAttemptAt.Equal(decided.NextAttemptAt), "due %d at %s, decided %s", i+2, d.Due.NextAttemptAt, decided.NextAttemptAt)
		requireOrder(t, order, d.Due.Payload)
		require.False(t, ran[i].stored.Before(decided.NextAttemptAt), "attempt %d ran before its time", i+2)
	}

	shipments := e.shipments(t, order.OrderID)
	require.Len(t, shipments, 1)
	require.Equal(t, Shipment{OrderID: order.OrderID, SKU: "lamp", Qty: 2, Warehouse: "main", Attempt: 3}, shipments[0])
}

// An order whose warehouse is closed is held, not failed: it keeps its
// retries and would wait an hour. The warehouse reopening
// (retry.order.released.eu-1) makes it due at once, and its second
// attempt ships it.
func TestHeldOrderShipsWhenItsWarehouseReopens(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	e.scheduler(t)
	e.orders(t, config{})
	order := Order{OrderID: "ord-held", SKU: "desk", Qty: 1, Warehouse: "eu-1", HoldFirst: "1h"}
	e.place(t, order)

	held := e.waitFact(t, order.OrderID, contract.Held, 1).Held
	require.Equal(t, contract.HoldThrottle, held.Reason)
	require.Equal(t, "eu-1", held.HoldKey)
	require.Equal(t, "warehouse eu-1 is closed", held.Detail)
	requireOrder(t, order, held.Payload)
	decided := e.waitFact(t, order.OrderID, contract.Scheduled, 2).Scheduled
	require.Equal(t, contract.DecidedByHold, decided.Decision.DecidedBy)
	require.Zero(t, decided.Decision.RetryCount, "a hold uses no retry")
	// Postgres keeps microseconds.
	require.True(t, decided.NextAttemptAt.Equal(held.Until.Truncate(time.Microsecond)), "held until %s, due at %s", held.Until, decided.NextAttemptAt)
	require.Empty(t, e.shipments(t, order.OrderID))

	require.NoError(t, reopenWarehouse(e.ctx, e.srv.ClientURL(), "eu-1"))
	succeeded := e.waitFact(t, order.OrderID, contract.Succeeded, 2)
	require.True(t, succeeded.stored.Before(*held.Until), "shipped before the hold's end")
	facts := e.facts(t, order.OrderID)
	require.Empty(t, only(facts, contract.Failed), "facts: %v", facts)
	// The retry history says why it ran early: the release, not the
	// hold's end.
	h := e.history(t, order.OrderID, 5)
	require.Equal(t, []string{"held:1", "scheduled:2", "rescheduled:2", "due:2", "succeeded:2"}, events(h))
	require.Equal(t, contract.DecidedByResume, h[2].DecidedBy)
	var release contract.Decision
	require.NoError(t, json.Unmarshal(h[2].Detail, &release))
	require.Zero(t, release.RetryCount, "a hold uses no retry")

	shipments := e.shipments(t, order.OrderID)
	require.Len(t, shipments, 1)
	require.Equal(t, 2, shipments[0].Attempt)
}

// RETRIES is purged after the order's failure was stored and before the
// scheduler read it (the scheduler starts only after the purge). The
// owner kept the failure; finding it gone from the stream past the
// duplicate window, it publishes it again with its Nats-Msg-Id, and the
// order is retried and shipped: nothing lost, nothing decided twice.
func TestFailureLostToAPurgeIsPublishedAgain(t *testing.T) {
	t.Parallel()
	e := setup(t, time.Second)
	e.orders(t, config{republishAfter: 1500 * time.Millisecond})
	order := Order{OrderID: "ord-purged", SKU: "lamp", Qty: 1, FailFirst: 1}
	e.place(t, order)

	lost := e.waitFact(t, order.OrderID, contract.Failed, 1)
	retries, err := e.js.Stream(e.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.NoError(t, retries.Purge(e.ctx))
	require.Empty(t, e.facts(t, order.OrderID), "purged")
	e.scheduler(t)

	e.waitFact(t, order.OrderID, contract.Succeeded, 2)
	facts := e.facts(t, order.OrderID)
	failed := only(facts, contract.Failed)
	require.Len(t, failed, 1, "facts: %v", facts)
	require.Equal(t, lost.Envelope.ID, failed[0].Envelope.ID, "the same fact, with the same id")
	require.Equal(t, lost.Failed, failed[0].Failed)
	require.True(t, failed[0].stored.After(lost.stored), "stored again after the purge")
	require.Len(t, only(facts, contract.Scheduled), 1, "facts: %v", facts)

	// The scheduler's history of the order: the failure applied once and
	// decided once.
	require.Equal(t, []string{"failed:1", "scheduled:2", "due:2", "succeeded:2"}, events(e.history(t, order.OrderID, 4)))

	shipments := e.shipments(t, order.OrderID)
	require.Len(t, shipments, 1)
	require.Equal(t, 2, shipments[0].Attempt)
}

// The service is killed (SIGKILL) in two attempts at once, each after its
// shipment and before its fact: the first attempt of one order, run from
// ORDERS, and the retry of another, run from its due. Started again, it
// gets both again (ORDERS redelivers the order, RETRIES the due), finds
// each shipment done and reports it: each order ends succeeded with one
// shipment. SIGTERM then stops it with exit status 0.
func TestKilledServiceShipsEachOrderOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	e.scheduler(t)
	bin := build(t, e.ctx)
	// Redeliveries come 6 s after the kill; an attempt is cut at 3 s.
	slow := e.start(t, bin, "orders-killed", "-ack-wait", "6s", "-slow-after-shipment", "10m")
	retried := Order{OrderID: "ord-kill-retry", SKU: "lamp", Qty: 1, FailFirst: 1}
	first := Order{OrderID: "ord-kill-first", SKU: "book", Qty: 1}
	e.place(t, retried)
	// Its first attempt failed, and ORDERS moves on to the next order.
	killed := e.waitFact(t, retried.OrderID, contract.Failed, 1).Failed.Executor
	e.place(t, first)
	for _, id := range []string{retried.OrderID, first.OrderID} {
		require.Eventually(t, func() bool {
			_, ok := e.last(t, ShipmentsStream, ShipmentSubject(id))
			return ok
		}, wait, tick, "shipment of %s", id)
	}
	require.NoError(t, slow.Kill9())
	for _, id := range []string{retried.OrderID, first.OrderID} {
		require.Empty(t, only(e.facts(t, id), contract.Succeeded), "%s: killed before its fact", id)
	}

	again := e.start(t, bin, "orders-again", "-ack-wait", "6s")
	for _, o := range []struct {
		id      string
		attempt int
	}{{first.OrderID, 1}, {retried.OrderID, 2}} {
		ok := e.waitFact(t, o.id, contract.Succeeded, o.attempt)
		require.NotEqual(t, killed, ok.Succeeded.Executor, "%s: reported by the instance started again", o.id)
		shipments := e.shipments(t, o.id)
		require.Len(t, shipments, 1, "%s: one shipment", o.id)
		require.Equal(t, o.attempt, shipments[0].Attempt)
	}
	require.NoError(t, again.Term(wait), "exit status after SIGTERM")
}

// requireOrder checks that raw is the order as placed.
func requireOrder(t *testing.T, want Order, raw json.RawMessage) {
	t.Helper()
	var got Order
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, want, got)
}
