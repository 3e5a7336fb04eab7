package faults_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 6: Postgres restarts (fast and immediate) and service
// connections terminated before, during and after COMMIT, under load of
// HTTP events and failures: every event admitted once, every failure due
// once.
func TestScenario06PostgresRestartsAndKilledConnections(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	nEvents := harness.Size(600, 20_000)
	nItems := harness.Size(1200, 20_000)
	rounds := harness.Size(1, 3)
	pg := ownPostgres(t, "retryd")
	s := setup(t, harness.Options{DatabaseURL: pg.URL("retryd")})
	r := &harness.Report{Scenario: "06 restart postgres, kill connections"}
	s.Start(harness.Scheduler)
	s.Start(harness.Ingress)
	pace := s.Pace(r, assumeAll(r,
		requirement{"every event admitted (INGEST, EVENTS), every failure resolved (failed, scheduled, due, succeeded)",
			msgsPerAdmission*nEvents + msgsPerRetry*nItems, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-06", time.Second, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	// The faults take about 6 s per round; the load is paced to span them.
	span := time.Duration(rounds) * 8 * time.Second
	events := make([]map[string]any, nEvents)
	for i := range events {
		events[i] = map[string]any{"id": fmt.Sprintf("s06-ev-%06d", i), "source": "shop", "type": "order.created"}
	}
	ids, msgs := failedItems(t, kind, "s06", nItems, nil)
	sender, waitLoad := spreadLoad(s, span, events, msgs, 50)

	var last time.Time
	for range rounds {
		for _, point := range []string{harness.KillBeforeCommit, harness.KillDuringCommit, harness.KillAfterCommit} {
			n, _ := harness.KillConnections(s.Ctx, s.Pool, point, time.Second, 2*time.Millisecond)
			r.Fault("terminated %d service connections %s COMMIT (1s of polling)", n, point)
		}
		for _, mode := range []string{"fast", "immediate"} {
			if err := pg.Restart(s.Ctx, mode, 500*time.Millisecond); err != nil {
				t.Fatalf("restart postgres (%s): %v", mode, err)
			}
			r.Fault("postgres stopped (%s) for 0.5s and started (%d events accepted, %d dues)", mode, len(sender.Accepted()), owner.Count())
			last = time.Now()
		}
	}
	waitLoad(t)

	var counts map[string]int
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 200*time.Millisecond, func() bool {
		if owner.Count() < nItems || states(s.Ctx, s.Pool, kind)["succeeded"] < nItems {
			return false
		}
		stored, err := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events.>")
		if err != nil {
			return false
		}
		counts = harness.CountByMsgID(stored)
		return len(counts) >= nEvents
	})
	r.Recover = time.Since(last)
	dueCheck(t, s, owner, kind, ids, r)
	accepted, _ := eventCheck(r, sender, counts)
	var admittedRows int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM workflow_events WHERE status = 'admitted'`).Scan(&admittedRows)
	r.Note("events: %d accepted, %d admitted on EVENTS, %d admitted rows; retry rows %v", accepted, len(counts), admittedRows, states(s.Ctx, s.Pool, kind))
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 || accepted != nEvents {
		t.Fatalf("lost %d, duplicate effects %d, accepted %d of %d (resolved: %v)%s", r.Lost, r.DuplicateEffects, accepted, nEvents, ok, timedOut(ok, pace))
	}
}
