package faults_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
)

// Scenario 2: ingress, triggers and the worker are killed with kill -9 at
// random points under load, several rounds, and restarted: every accepted
// event is admitted once and launches one run, every job has its effect
// once.
func TestScenario02KillOwnersUnderLoad(t *testing.T) {
	t.Parallel()
	nEvents := harness.Size(300, 20_000)
	nJobs := harness.Size(150, 5000)
	rounds := harness.Size(2, 6)
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "02 kill -9 ingress, triggers, worker"}
	f := startFlow(t, s, "s02", nEvents, nJobs)
	pace := s.Pace(r, assumeAll(r,
		requirement{"every event admitted and run, every job done", msgsPerFlowEvent*nEvents + msgsPerJob*nJobs, scenarioTimeout()},
	))
	span := time.Duration(rounds) * 3 * time.Second
	loadDone := f.load(span)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	victims := []string{harness.Ingress, harness.Triggers, harness.Worker}
	var last time.Time
	for round := range rounds {
		rng.Shuffle(len(victims), func(i, j int) { victims[i], victims[j] = victims[j], victims[i] })
		for _, v := range victims {
			time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // a random point in the load
			p := s.Service(v)
			if err := p.Kill9(); err != nil {
				t.Fatal(err)
			}
			down := time.Duration(100+rng.IntN(700)) * time.Millisecond
			r.Fault("round %d: kill -9 %s, down %s (%d events accepted)", round+1, v, down, len(f.sender.Accepted()))
			time.Sleep(down) // the outage itself
			s.Restart(v)
			last = time.Now()
		}
	}
	for range 2 {
		if err := <-loadDone; err != nil {
			t.Fatalf("load: %v", err)
		}
	}
	var res flowResult
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 500*time.Millisecond, func() bool {
		res = f.check(t)
		return res.done
	})
	r.Recover = time.Since(last)
	r.Sent, r.Lost, r.DuplicateEffects, r.Absorbed = res.events+res.jobs, res.lost, res.dups, res.absorbed
	for _, d := range res.detail {
		r.Note("%s", d)
	}
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (resolved %v)%s", r.Lost, r.DuplicateEffects, ok, timedOut(ok, pace))
	}
}
