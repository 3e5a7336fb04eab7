package ingress_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

func TestNATSIntake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putSource(t, "crm", map[string]any{"allowed_types": []string{"contact.created"}})

	publish := func(subject, msgID, body string) {
		t.Helper()
		msg := nats.NewMsg(subject)
		msg.Data = []byte(body)
		if msgID != "" {
			msg.Header.Set(nats.MsgIdHdr, msgID)
		}
		_, err := b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	// A producer that sets only the header, one that sets both.
	publish("ingest.crm", "n-1", `{"source":"crm","type":"contact.created"}`)
	publish("ingest.crm", "n-2", `{"id":"n-2","source":"crm","type":"contact.created","data":{"a":1}}`)
	// Bad input: each is terminated, counted and stores nothing.
	bad := []struct{ subject, msgID, body string }{
		{"ingest.crm", "m-1", `{"source":"crm","type":`},
		{"ingest.crm", "m-2", `{"source":"crm","type":"contact.created","x_y":1}`},
		{"ingest.crm", "m-3", `{"source":"billing","type":"contact.created"}`},
		{"ingest.crm", "", `{"source":"crm","type":"contact.created"}`},
		{"ingest.crm", "m-5", `{"id":"other","source":"crm","type":"contact.created"}`},
		{"ingest.crm", "m-6", `{"source":"crm","type":"contact.deleted"}`},
		{"ingest.crm", "m-7", `{"source":"crm","type":"contact.created","data":"` + strings.Repeat("x", 600<<10) + `"}`},
		{"ingest.Crm", "m-8", `{"source":"crm","type":"contact.created"}`},
	}
	for _, m := range bad {
		publish(m.subject, m.msgID, m.body)
	}
	b.waitStatus(t, "admitted", "n-1", "n-2")
	require.Eventually(t, func() bool {
		return b.counter(t, "retryd_ingress_malformed_total", map[string]string{"consumer": ingress.ConsumerGate}) == 7 &&
			b.counter(t, "retryd_ingress_gate_total", map[string]string{"source": "crm", "decision": "rejected"}) == 1
	}, eventually, 20*time.Millisecond)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM workflow_events`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM inbox WHERE consumer = $1 AND msg_id LIKE 'm-%'`, ingress.ConsumerGate))

	// Terminated messages are not delivered again.
	b.drained(t, ingress.ConsumerGate)
}

func TestThrottledEventIsDeferredAndAdmittedWhenDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.throttled(t, "billing", "invoice.paid", "first", "second")

	var v ingress.EventView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/events/second", nil, &v))
	require.Equal(t, "deferred", v.Status)
	require.NotNil(t, v.Retry)
	require.Equal(t, "scheduled", v.Retry.State)
	require.Equal(t, 1, v.Retry.Attempts)
	require.Contains(t, v.Retry.LastError, "source_throttled: rate limit of 1 per 1h0m0s reached")
	require.NotNil(t, v.Retry.NextAttemptAt)
	require.Zero(t, v.Retry.NextAttemptAt.UnixMilli()%time.Hour.Milliseconds(), "retry at the window's reset")

	// A hold, not a failure: no error class, the window's end as until.
	var held []contract.LifecycleEvent
	require.Eventually(t, func() bool {
		held = b.lifecycle(t, "second")[contract.Held]
		return len(held) == 1
	}, eventually, 20*time.Millisecond)
	require.Empty(t, b.lifecycle(t, "second")[contract.Failed])
	hd := held[0].Held
	require.Equal(t, 1, hd.Attempt)
	require.Equal(t, contract.HoldThrottle, hd.Reason)
	require.Equal(t, "billing", hd.Source)
	require.Equal(t, "billing", hd.HoldKey)
	require.Contains(t, hd.Detail, "source_throttled: rate limit of 1 per 1h0m0s reached")
	require.NotNil(t, hd.Until)
	require.True(t, hd.Until.Equal(*v.Retry.NextAttemptAt))
	require.Equal(t, "event-held:second:1", held[0].Envelope.ID)

	// The scheduler confirms, then attempt 2 comes due while the window is
	// still full: held again, attempt 2.
	next := time.Now().Add(time.Hour)
	b.publishScheduled(t, contract.Scheduled, "second", "billing", 2, next)
	require.Eventually(t, func() bool {
		return b.do(t, http.MethodGet, "/v1/events/second", nil, &v) == 200 && v.Retry.NextAttemptAt.Equal(next.UTC().Truncate(time.Microsecond))
	}, eventually, 20*time.Millisecond)
	require.Equal(t, "throttle", v.Retry.Metadata["decided_by"])
	b.publishDue(t, "second", "billing", 2)
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "second")[contract.Held]) == 2 }, eventually, 20*time.Millisecond)
	require.Equal(t, 2, b.lifecycle(t, "second")[contract.Held][1].Held.Attempt)

	// The limit is lifted: the release line admits it, as attempt 3 (the
	// one the scheduler confirmed next), and reports success.
	b.putSource(t, "billing", map[string]any{})
	b.waitStatus(t, "admitted", "second")
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "second")[contract.Succeeded]) == 1 }, eventually, 20*time.Millisecond)
	sd := b.lifecycle(t, "second")[contract.Succeeded][0].Succeeded
	require.Equal(t, 3, sd.Attempt)
	require.Equal(t, 200, b.do(t, http.MethodGet, "/v1/events/second", nil, &v))
	require.Equal(t, "completed", v.Retry.State)
	require.Equal(t, 3, v.Retry.Attempts)
	require.Eventually(t, func() bool { return b.admittedIDs(t)["second"] == 1 }, eventually, 20*time.Millisecond)

	// A due delivered again after the admission only repeats the success.
	b.publishDue(t, "second", "billing", 4)
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "second")[contract.Succeeded]) == 2 }, eventually, 20*time.Millisecond)
	require.Equal(t, 1, b.admittedIDs(t)["second"])

	require.EqualValues(t, 2, b.counter(t, "retryd_ingress_deferrals_total", map[string]string{"source": "billing", "reason": "source_throttled"}))
	require.EqualValues(t, 2, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "due"}))
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "completed"}))
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "scheduled"}))
}

func TestPausedSourceDefersWithoutHint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var src ingress.SourceView
	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/sources/crm/pause", map[string]any{"reason": "migration"}, &src))
	require.True(t, src.Paused)

	b.post(t, event("p-1", "crm", "contact.created"))
	b.waitStatus(t, "deferred", "p-1")
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "p-1")[contract.Held]) == 1 }, eventually, 20*time.Millisecond)
	hd := b.lifecycle(t, "p-1")[contract.Held][0].Held
	require.Equal(t, contract.HoldPause, hd.Reason)
	require.Equal(t, "crm", hd.HoldKey)
	require.Nil(t, hd.Until, "an indefinite pause holds until resumed")

	// Due while paused: held again. The resume releases the source's
	// holds; after it, admitted.
	b.publishDue(t, "p-1", "crm", 2)
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "p-1")[contract.Held]) == 2 }, eventually, 20*time.Millisecond)
	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/sources/crm/resume", nil, &src))
	require.False(t, src.Paused)
	require.EqualValues(t, 1, src.Deferred)
	var released []*jetstream.RawStreamMsg
	require.Eventually(t, func() bool {
		released = streamMsgs(t, b.ctx, b.js, contract.StreamRetries, "retry.event.released.crm")
		return len(released) == 1
	}, eventually, 20*time.Millisecond)
	rel, err := contract.DecodeLifecycle(released[0].Subject, released[0].Data)
	require.NoError(t, err)
	require.Equal(t, contract.ReleaseResume, rel.Released.Reason)
	require.True(t, rel.Released.ReleasedAt.After(b.lifecycle(t, "p-1")[contract.Held][1].Envelope.Time),
		"released after the last hold was decided")
	b.publishDue(t, "p-1", "crm", 3)
	b.waitStatus(t, "admitted", "p-1")

	// A pause with an end hints the end.
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	require.Equal(t, 200, b.do(t, http.MethodPost, "/v1/sources/crm/pause", map[string]any{"until": until}, &src))
	b.post(t, event("p-2", "crm", "contact.created"))
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "p-2")[contract.Held]) == 1 }, eventually, 20*time.Millisecond)
	hd = b.lifecycle(t, "p-2")[contract.Held][0].Held
	require.NotNil(t, hd.Until)
	require.True(t, until.Equal(*hd.Until))
}

func TestDueEdgeCases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.throttled(t, "billing", "invoice.paid", "a", "d")

	// The event is not in the database: the retry is cancelled, not looped.
	b.publishDue(t, "ghost", "billing", 2)
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "ghost")[contract.Cancelled]) == 1 }, eventually, 20*time.Millisecond)
	cd := b.lifecycle(t, "ghost")[contract.Cancelled][0].Cancelled
	require.Equal(t, "ingress", cd.By)
	require.Contains(t, cd.Reason, "event_missing")

	// Admitted at its first attempt, yet a due arrives: report success.
	b.publishDue(t, "a", "billing", 2)
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "a")[contract.Succeeded]) == 1 }, eventually, 20*time.Millisecond)

	// A due for an attempt already evaluated (a replay older than the
	// inbox) changes nothing.
	b.publishDue(t, "d", "billing", 1)
	b.drained(t, ingress.ConsumerRetry)
	require.Len(t, b.lifecycle(t, "d")[contract.Held], 1)
	require.Equal(t, "deferred", b.status(t, "d"))

	// The type is no longer allowed: the deferral is cancelled.
	b.putSource(t, "billing", map[string]any{"allowed_types": []string{"invoice.voided"}})
	b.publishDue(t, "d", "billing", 3)
	b.waitStatus(t, "cancelled", "d")
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "d")[contract.Cancelled]) == 1 }, eventually, 20*time.Millisecond)
	require.Contains(t, b.lifecycle(t, "d")[contract.Cancelled][0].Cancelled.Reason, "type_not_allowed")
	require.NotContains(t, b.admittedIDs(t), "d")

	// Malformed lifecycle messages are terminated and counted.
	msg := nats.NewMsg("retry.event.due.bad")
	msg.Data = []byte(`{"specversion":"1.0"}`)
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.counter(t, "retryd_ingress_malformed_total", map[string]string{"consumer": ingress.ConsumerRetry}) == 1
	}, eventually, 20*time.Millisecond)
}

// A resume under a rate limit lines the held events up in arrival order
// (ingressstore.PaceRelease), the throttled event ahead of the paused one,
// and the releaser admits each at its slot: a due for an event in the
// line changes nothing, and the event behind stays deferred when the one
// ahead is admitted.
func TestReleaseLineAdmitsInArrivalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.throttled(t, "shop", "order.created", "first", "waiting")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/shop/pause", map[string]any{}, nil))
	b.post(t, event("paused", "shop", "order.created"))
	b.waitStatus(t, "deferred", "paused")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/shop/resume", nil, nil))

	line := pgtest.Strings(t, b.pool, `SELECT event_id FROM event_source_holds WHERE source = 'shop' AND released ORDER BY slot_at`)
	require.Equal(t, []string{"waiting", "paused"}, line, "the resume lined both up in arrival order")
	var resume *contract.ReleasedData
	require.Eventually(t, func() bool {
		for _, lc := range b.lifecycle(t, "shop")[contract.Released] {
			if lc.Released.Reason == contract.ReleaseResume {
				resume = lc.Released
			}
		}
		return resume != nil
	}, eventually, 20*time.Millisecond)
	require.True(t, resume.OwnerAdmits, "the scheduler is told ingress admits them")
	require.NotNil(t, resume.Pace)

	// A due for the event behind (a hold applied after the release) is
	// left to the line: handed back, not evaluated, not held again.
	b.publishDue(t, "paused", "shop", 2)
	require.Eventually(t, func() bool {
		return b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "shop", "event": "waited"}) == 1
	}, eventually, 20*time.Millisecond)
	require.Equal(t, "deferred", b.status(t, "paused"))
	require.Len(t, b.lifecycle(t, "paused")[contract.Held], 1)
	require.Zero(t, b.count(t, `SELECT count(*) FROM inbox WHERE consumer = $1 AND msg_id LIKE '%paused%'`, ingress.ConsumerRetry), "the claim rolled back with the hand-back")

	// The first slot comes (the next window, brought forward): the
	// releaser admits the event ahead, reports it, and only it: the
	// window's one admission is taken.
	_, err := b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = now() WHERE event_id = 'waiting'`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `DELETE FROM event_source_windows WHERE source = 'shop'`) // the window is new
	require.NoError(t, err)
	b.waitStatus(t, "admitted", "waiting")
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "waiting")[contract.Succeeded]) == 1 }, eventually, 20*time.Millisecond)
	require.Equal(t, 2, b.lifecycle(t, "waiting")[contract.Succeeded][0].Succeeded.Attempt)
	require.Equal(t, "deferred", b.status(t, "paused"), "the event behind waits for its own slot")
	require.Equal(t, map[string]int{"first": 1, "waiting": 1}, b.admittedIDs(t))
}

// A burst published at once is decided in arrival order per source with
// the default concurrency: the window's admissions reach EVENTS in order
// and the held events' slots follow arrival order (before, parallel
// workers took slots in the order they reached the source). An event the
// source refuses sends its source's batch to one transaction per event,
// still in order; a duplicate in the burst is stored once.
func TestGateDecidesEachSourceInArrivalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 20
	servicetest.ClearOfWindowEdge(t, 8760*time.Hour, time.Minute)
	b.putSource(t, "burst", map[string]any{"rate_limit": limit, "rate_window": "8760h"})
	b.putSource(t, "picky", map[string]any{"rate_limit": limit, "rate_window": "8760h", "allowed_types": []string{"tick.happened"}})

	var burst, picky []string
	var msgs []*nats.Msg
	publish := func(source, id, typ string, header bool) {
		msg := nats.NewMsg("ingest." + source)
		msg.Data = []byte(fmt.Sprintf(`{"id":%q,"source":%q,"type":%q}`, id, source, typ))
		if header {
			msg.Header.Set(nats.MsgIdHdr, id)
		}
		msgs = append(msgs, msg)
	}
	for i := range 150 {
		id := fmt.Sprintf("b-%03d", i)
		burst = append(burst, id)
		publish("burst", id, "tick.happened", true)
		if i%2 == 0 {
			id := fmt.Sprintf("p-%03d", i)
			typ := "tick.happened"
			if i == 40 {
				typ = "tick.refused"
			} else {
				picky = append(picky, id)
			}
			publish("picky", id, typ, true)
		}
		if i == 60 {
			// The same event again, past JetStream's deduplication (no
			// Nats-Msg-Id): the gate's inbox stores it once.
			publish("burst", "b-005", "tick.happened", false)
		}
	}
	natstest.PublishAll(t, b.ctx, b.js, msgs)
	b.waitCount(t, len(burst)+len(picky), `SELECT count(*) FROM workflow_events WHERE status IN ('admitted', 'deferred')`)
	// At least once, not exactly once: a message that waits in the
	// client's pull buffer past the 1 s ack wait (a busy machine) comes
	// back, and the gate counts the copy as a duplicate, or rejects it
	// again (internal/durable's inHand). What must be exactly once is what
	// is stored: b-005 once in the orders below, p-040 not at all.
	require.Eventually(t, func() bool {
		return b.counter(t, "retryd_ingress_gate_total", map[string]string{"source": "picky", "decision": "rejected"}) >= 1 &&
			b.counter(t, "retryd_ingress_gate_total", map[string]string{"source": "burst", "decision": "duplicate"}) >= 1
	}, eventually, 20*time.Millisecond)
	require.Zero(t, pgtest.Count(t, b.pool, `SELECT count(*) FROM workflow_events WHERE event_id = 'p-040'`), "the refused type is not stored")

	for source, want := range map[string][]string{"burst": burst, "picky": picky} {
		require.Eventually(t, func() bool {
			return len(streamMsgs(t, b.ctx, b.js, contract.StreamEvents, "events."+source+".")) == limit
		}, eventually, 20*time.Millisecond, source)
		admitted := b.admissionOrder(t, source)
		require.Equal(t, want[:limit], admitted, "%s: the window's admissions in arrival order", source)
		held := pgtest.Strings(t, b.pool, `SELECT event_id FROM event_source_holds WHERE source = $1 ORDER BY slot_at`, source)
		require.Equal(t, want[limit:], held, "%s: the held events' slots in arrival order", source)
	}
	b.drained(t, ingress.ConsumerGate)
}
