package faults_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 4: nats-server is restarted, gracefully and with kill -9, while
// producers post events over HTTP and owners publish failures: every
// event ingress acknowledged (202) is admitted exactly once and every
// acknowledged failure comes due exactly once.
func TestScenario04RestartNATSDuringLoad(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	nEvents := harness.Size(600, 20_000)
	nItems := harness.Size(1000, 20_000)
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "04 restart nats-server during load"}
	s.Start(harness.Scheduler)
	s.Start(harness.Ingress)
	restarts := harness.Size(2, 4)
	pace := s.Pace(r, assumeAll(r,
		requirement{"events accepted (INGEST) before each restart", nEvents / (restarts + 1), time.Minute},
		requirement{"every event admitted (INGEST, EVENTS), every failure resolved (failed, scheduled, due, succeeded)",
			msgsPerAdmission*nEvents + msgsPerRetry*nItems, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-04", time.Second, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	events := make([]map[string]any, nEvents)
	for i := range events {
		events[i] = map[string]any{"id": fmt.Sprintf("s04-ev-%06d", i), "source": "shop", "type": "order.created",
			"data": map[string]any{"n": i}}
	}
	// Paced so that the load spans the restarts.
	span := time.Duration(restarts+1) * 1500 * time.Millisecond
	ids, msgs := failedItems(t, kind, "s04", nItems, nil)
	sender, waitLoad := spreadLoad(s, span, events, msgs, 100)

	var last time.Time
	for k, graceful := range []bool{true, false, true, false}[:restarts] {
		if _, ok := harness.Eventually(s.Ctx, time.Minute, 10*time.Millisecond, func() bool {
			return len(sender.Accepted()) >= nEvents*(k+1)/(restarts+1) && owner.Count() > 0
		}); !ok {
			t.Fatalf("no load went through before the restart: %d events accepted, %d dues; %s", len(sender.Accepted()), owner.Count(), pace.Explain())
		}
		how := "kill -9"
		if graceful {
			how = "SIGTERM"
		}
		r.Fault("restart nats-server (%s) after %d events accepted, %d dues", how, len(sender.Accepted()), owner.Count())
		if err := s.NATS.Restart(s.Ctx, graceful); err != nil {
			t.Fatal(err)
		}
		last = time.Now()
	}
	waitLoad(t)

	// Every accepted event admitted (stored on EVENTS) and every failure
	// due.
	admitted := func() map[string]int {
		stored, err := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events.>")
		if err != nil {
			return nil
		}
		return harness.CountByMsgID(stored)
	}
	var counts map[string]int
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 200*time.Millisecond, func() bool {
		if owner.Count() < nItems {
			return false
		}
		counts = admitted()
		return len(counts) >= nEvents
	})
	r.Recover = time.Since(last)
	dueCheck(t, s, owner, kind, ids, r)
	accepted, lostEvents := eventCheck(r, sender, counts)
	r.Absorbed += s.Wire.Extra(counts, func(id string) bool { return len(id) > 7 && id[:7] == "s04-ev-" })
	r.Note("events: %d accepted (202), %d admitted, %d lost; producer re-sends %d (%d answered duplicate)",
		accepted, len(counts), lostEvents, sender.Retries.Load(), sender.Duplicate.Load())
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 || accepted != nEvents {
		t.Fatalf("lost %d, duplicate effects %d, accepted %d of %d (all resolved: %v)%s", r.Lost, r.DuplicateEffects, accepted, nEvents, ok, timedOut(ok, pace))
	}
}
