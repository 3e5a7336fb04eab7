package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 7: every kind of message sent twice, inside the JetStream
// duplicate window (same Nats-Msg-Id: the stream drops it) and outside
// it (no Nats-Msg-Id, or after the window in the full run: the stream
// stores it, the consumers' inbox and state guards drop it). Each item
// has its effect once.
func TestScenario07Duplicates(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	n := harness.Size(200, 2000)
	nEvents := harness.Size(40, 200)
	limit := max(5, nEvents/10) // events the source admits per second
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "07 duplicates inside and outside the window"}
	s.Start(harness.Scheduler)
	s.Start(harness.Ingress)
	// An item: failed stored twice (the copy with the same Nats-Msg-Id is
	// dropped), three times in the full run, then scheduled, due,
	// succeeded. An event: INGEST three times (the second HTTP post is
	// dropped), EVENTS, and a deferral with a re-published due copy each
	// time the source, admitting limit a second, sends it back (policy
	// below: 0.5s doubling to 2s). The full run sleeps past the duplicate
	// window, when nothing moves.
	perItem, still := msgsPerRetry+1, time.Duration(0)
	if harness.Full() {
		perItem, still = perItem+1, 2*time.Minute+5*time.Second
	}
	perEvent := 3 + 1 + (msgsPerDeferral+1)*deferrals(time.Duration(nEvents/limit)*time.Second, 2*time.Second)
	pace := s.Pace(r, assumeAll(r,
		requirement{"every item due once and every event admitted, copies included", perItem*n + perEvent*nEvents, scenarioTimeout() - still},
	))
	s.Policy(kind, "", fastPolicy("faults-07", time.Second, 3))
	// Throttled attempts use retries: enough for every deferral to wait
	// its turn.
	s.Policy("event", "", fastPolicy("faults-07-event", 500*time.Millisecond, 1000))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	// Failures: each published three times: as built, again with the
	// same Nats-Msg-Id (inside the window), and without it (stored again).
	ids, msgs := failedItems(t, kind, "s07", n, nil)
	if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
		t.Fatal(err)
	}
	dups, err := harness.PublishAll(s.Ctx, s.JS, msgs)
	if err != nil {
		t.Fatal(err)
	}
	r.Note("failures re-sent with their Nats-Msg-Id: %d of %d dropped by JetStream", dups, n)
	if _, err := harness.PublishAll(s.Ctx, s.JS, withoutMsgID(msgs)); err != nil {
		t.Fatal(err)
	}
	r.Fault("each of %d failures published 3 times (same id twice, then without Nats-Msg-Id)", n)

	// Events: a source that admits a few events per second defers the rest,
	// so dues travel too. Each event is posted twice over HTTP and
	// published twice on ingest.<source> without a Nats-Msg-Id.
	s.MustDo(http.MethodPut, s.URL(harness.Ingress)+"/v1/sources/dup", map[string]any{"rate_limit": limit, "rate_window": "1s"}, http.StatusOK)
	sender := &harness.EventSender{Sys: s, URL: s.URL(harness.Ingress)}
	var evIDs []string
	for i := range nEvents {
		id := fmt.Sprintf("s07-ev-%04d", i)
		evIDs = append(evIDs, id)
		ev := map[string]any{"id": id, "source": "dup", "type": "thing.happened"}
		for range 2 {
			if err := sender.Send(s.Ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		body, _ := json.Marshal(ev)
		for range 2 {
			if err := s.NC.Publish(contract.IngestSubject("dup"), body); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.Note("events: %d posted twice (%d answered duplicate) and published twice without Nats-Msg-Id", nEvents, sender.Duplicate.Load())

	// Every due ingress receives is delivered a second time as a stored
	// copy without a Nats-Msg-Id, as if the scheduler had re-emitted it
	// after the window.
	redelivered := map[string]bool{}
	copyDues := func() {
		dues, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(contract.KindEvent, contract.Due))
		if err != nil {
			t.Fatal(err)
		}
		var copies []*nats.Msg
		for _, d := range dues {
			if d.MsgID == "" || redelivered[d.MsgID] {
				continue
			}
			redelivered[d.MsgID] = true
			copies = append(copies, &nats.Msg{Subject: d.Subject, Data: d.Data, Header: nats.Header{}})
		}
		if _, err := harness.PublishAll(s.Ctx, s.JS, copies); err != nil {
			t.Fatal(err)
		}
	}

	late := 0
	if harness.Full() {
		// Outside the window for real: the same Nats-Msg-Id again after
		// the 2 minute duplicate window.
		time.Sleep(2*time.Minute + 5*time.Second) // the window must pass
		dropped, err := harness.PublishAll(s.Ctx, s.JS, msgs)
		if err != nil {
			t.Fatal(err)
		}
		late = n
		r.Fault("the %d failures published again after the duplicate window (%d dropped by JetStream)", n, dropped)
	}

	start := time.Now()
	var evCounts map[string]int
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 200*time.Millisecond, func() bool {
		copyDues()
		stored, err := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events.>")
		if err != nil {
			return false
		}
		evCounts = harness.CountByMsgID(stored)
		return owner.Count() >= n && len(evCounts) >= nEvents && states(s.Ctx, s.Pool, kind)["succeeded"] == n
	})
	// The last copies need time to be consumed: a duplicate effect they
	// caused could only show up after it. This wait is the observation
	// window of a negative check, not a wait for a condition.
	copyDues()
	ctx, cancel := context.WithTimeout(s.Ctx, 3*time.Second)
	defer cancel()
	<-ctx.Done()
	r.Recover = time.Since(start)
	dueCheck(t, s, owner, kind, ids, r)
	r.Fault("%d event dues re-published without Nats-Msg-Id", len(redelivered))

	var failedHistory, scheduledHistory int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FILTER (WHERE event = 'failed'), count(*) FILTER (WHERE event = 'scheduled')
FROM retry_history WHERE kind = $1`, kind).Scan(&failedHistory, &scheduledHistory)
	stored, _ := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events.>")
	evCounts = harness.CountByMsgID(stored)
	lostEvents := 0
	for _, id := range evIDs {
		if evCounts[id] == 0 {
			lostEvents++
		}
	}
	r.Sent += nEvents
	r.Lost += lostEvents
	r.DuplicateEffects += harness.Duplicates(evCounts)
	if failedHistory != n || scheduledHistory != n {
		r.DuplicateEffects += failedHistory - n
		t.Errorf("retry_history holds %d failed and %d scheduled facts for %d items, want one each", failedHistory, scheduledHistory, n)
	}
	// Absorbed: the copies JetStream dropped, the duplicate HTTP posts,
	// and the stored copies without Nats-Msg-Id the consumers dropped.
	r.Absorbed += dups + int(sender.Duplicate.Load()) + n + late + 2*nEvents + len(redelivered)
	r.Note("history: %d failed, %d scheduled facts for %d items; events admitted %d of %d", failedHistory, scheduledHistory, n, len(evCounts), nEvents)
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (resolved %v)%s", r.Lost, r.DuplicateEffects, ok, timedOut(ok, pace))
	}
}

// withoutMsgID copies msgs without their Nats-Msg-Id, so JetStream
// stores them again.
func withoutMsgID(msgs []*nats.Msg) []*nats.Msg {
	out := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		h := nats.Header{}
		for k, v := range m.Header {
			if k != contract.HeaderMsgID {
				h[k] = v
			}
		}
		out[i] = &nats.Msg{Subject: m.Subject, Data: m.Data, Header: h}
	}
	return out
}
