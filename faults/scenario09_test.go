package faults_test

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
)

// libfaketime is what the Debian package faketime installs.
const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

// Scenario 9: the services' clock and Postgres' clock are 5 minutes
// apart, either way. libfaketime cannot move a Go program's clock (Go
// reads the time through the vDSO, not libc), so the skew is put on the
// Postgres side: the server runs with LD_PRELOAD=libfaketime and
// FAKETIME=±5m. The scheduler compares due times on the database clock,
// so no due may reach its owner before next_attempt_at by Postgres' clock,
// nor sooner after the failure than the policy's delay by the services'
// clock; the source gate's windows (also on the database clock) admit no
// more than their limit.
func TestScenario09ClockSkew(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(libfaketime); err != nil {
		// The full suite is the gate (make faults): it never skips.
		// make test skips without faketime outside CI, as it does
		// without chromium or node.
		if harness.Full() {
			harness.Missing(t, "libfaketime", err, "apt-get install faketime")
		}
		servicetest.NeedTool(t, false, "libfaketime ("+libfaketime+")", "apt-get install faketime")
	}
	for _, skew := range []string{"+5m", "-5m"} {
		t.Run("postgres"+skew, func(t *testing.T) {
			t.Parallel()
			clockSkew(t, skew)
		})
	}
}

func clockSkew(t *testing.T, skew string) {
	const kind = "ft"
	n := harness.Size(300, 5000)
	nEvents := harness.Size(16, 200)
	delay := 2 * time.Second
	const limit = 2 // events the source admits per second
	pg := ownPostgres(t, "retryd", "LD_PRELOAD="+libfaketime, "FAKETIME="+skew, "FAKETIME_DONT_FAKE_MONOTONIC=1")
	s := setup(t, harness.Options{DatabaseURL: pg.URL("retryd")})
	r := &harness.Report{Scenario: "09 clock skew, postgres " + skew}

	// The skew as the suite measures it: the largest possible value of
	// (Postgres clock - local clock), so an early due cannot hide in the
	// measurement.
	before := time.Now()
	var dbNow time.Time
	if err := s.Pool.QueryRow(s.Ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	offset := dbNow.Sub(before)
	if offset.Abs() < 4*time.Minute {
		t.Fatalf("postgres clock is only %s off: libfaketime did not take", offset)
	}
	r.Fault("postgres clock %s off the services' clock (FAKETIME=%s)", offset.Round(time.Millisecond), skew)

	s.Start(harness.Scheduler)
	s.Start(harness.Ingress)
	// Items: one retry cycle each. Events: INGEST, EVENTS, and a deferral
	// each time the source, admitting limit a second, sends one back
	// (event policy below: 0.3s doubling to 1.2s).
	perEvent := msgsPerAdmission + msgsPerDeferral*deferrals(time.Duration(nEvents/limit)*time.Second, 4*300*time.Millisecond)
	pace := s.Pace(r, assumeAll(r,
		requirement{"every item due, every event admitted", msgsPerRetry*n + perEvent*nEvents, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-09", delay, 3))
	s.Policy(contract.KindEvent, "", fastPolicy("faults-09-event", 300*time.Millisecond, 100))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	ids, msgs := failedItems(t, kind, "s09", n, nil)
	published := time.Now()
	if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
		t.Fatal(err)
	}
	s.MustDo(http.MethodPut, s.URL(harness.Ingress)+"/v1/sources/skew", map[string]any{"rate_limit": limit, "rate_window": "1s"}, http.StatusOK)
	sender := &harness.EventSender{Sys: s, URL: s.URL(harness.Ingress)}
	for i := range nEvents {
		if err := sender.Send(s.Ctx, map[string]any{"id": fmt.Sprintf("s09-ev-%03d", i), "source": "skew", "type": "tick"}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 100*time.Millisecond, func() bool {
		var admitted int
		_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM workflow_events WHERE status = 'admitted'`).Scan(&admitted)
		return owner.Count() >= n && admitted == nEvents
	})
	r.Recover = time.Since(start)
	dueCheck(t, s, owner, kind, ids, r)

	early, tooSoon := 0, 0
	var worst time.Duration = -time.Hour
	for _, e := range owner.Effects() {
		// By Postgres' clock: arrival (local) + offset must not precede
		// next_attempt_at (set by the scheduler on the database clock).
		if d := e.NextAttemptAt.Sub(e.FirstArrival.Add(offset)); d > 0 {
			early++
			worst = max(worst, d)
		}
		// By the services' clock: not sooner than the policy's delay after
		// the failure was published.
		if e.FirstArrival.Sub(published) < delay {
			tooSoon++
		}
	}
	var maxPerWindow int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM workflow_events
WHERE status = 'admitted' GROUP BY date_trunc('second', admitted_at)) w`).Scan(&maxPerWindow)
	r.Note("dues before next_attempt_at by the Postgres clock: %d (worst %s); dues sooner than %s after the failure: %d; most events admitted in one 1s window: %d (limit %d)",
		early, max(worst, 0), delay, tooSoon, maxPerWindow, limit)
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (resolved %v)%s", r.Lost, r.DuplicateEffects, ok, timedOut(ok, pace))
	}
	if early > 0 || tooSoon > 0 || maxPerWindow > limit {
		t.Fatalf("retries fired early under a %s clock skew: %d before next_attempt_at, %d sooner than the delay, %d admitted in one window (limit %d)",
			skew, early, tooSoon, maxPerWindow, limit)
	}
}
