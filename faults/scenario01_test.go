package faults_test

import (
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
)

// Scenario 1: kill -9 the scheduler mid-batch with many retries pending,
// twice (while it applies failures, then while it emits dues), restart
// it: every pending retry comes due exactly once.
func TestScenario01KillSchedulerMidBatch(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	n := harness.Size(2000, 100_000)
	delay := time.Duration(harness.Size(3, 20)) * time.Second
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "01 kill -9 scheduler mid-batch"}
	sched := s.Start(harness.Scheduler)
	kills := harness.Size(1, 3)
	// Every wait below is bounded by the scenario's context; the first
	// due phase is the largest step, the whole run the largest total.
	pace := s.Pace(r, assumeAll(r,
		requirement{"first kill: a third of the failures applied", n / 3, bounded(5 * time.Minute)},
		requirement{"first due phase: dues for the first target", msgsPerDue * (n / (kills + 1)), bounded(5 * time.Minute)},
		requirement{"every retry resolved (failed, scheduled, due, succeeded)", msgsPerRetry * n, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-01", delay, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	ids, msgs := failedItems(t, kind, "s01", n, nil)
	go func() {
		if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
			t.Errorf("publish failed events: %v", err)
		}
	}()

	// First kill: while the policy stage is applying failures.
	if _, ok := harness.Eventually(s.Ctx, 5*time.Minute, 5*time.Millisecond, func() bool {
		return sum(states(s.Ctx, s.Pool, kind)) >= n/3
	}); !ok {
		t.Fatalf("scheduler applied no failures: %v; %s", states(s.Ctx, s.Pool, kind), pace.Explain())
	}
	st := states(s.Ctx, s.Pool, kind)
	if err := sched.Kill9(); err != nil {
		t.Fatal(err)
	}
	r.Fault("kill -9 scheduler while applying failures (rows so far %v)", st)
	s.Restart(harness.Scheduler)

	// Then kills while due batches are being emitted: one in the short
	// run, three in the full one.
	var restarted time.Time
	for k := 1; k <= kills; k++ {
		target := n * k / (kills + 1)
		if _, ok := harness.Eventually(s.Ctx, 5*time.Minute, 5*time.Millisecond, func() bool {
			return owner.Count() >= target
		}); !ok {
			t.Fatalf("dues stopped: %d of %d, rows %v; %s", owner.Count(), n, states(s.Ctx, s.Pool, kind), pace.Explain())
		}
		st = states(s.Ctx, s.Pool, kind)
		if err := sched.Kill9(); err != nil {
			t.Fatal(err)
		}
		r.Fault("kill -9 scheduler while emitting dues (%d dues received, rows %v)", owner.Count(), st)
		restarted = time.Now()
		s.Restart(harness.Scheduler)
	}

	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 50*time.Millisecond, func() bool {
		return owner.Count() >= n && states(s.Ctx, s.Pool, kind)["succeeded"] == n
	})
	r.Recover = time.Since(restarted)
	dueCheck(t, s, owner, kind, ids, r)
	r.Note("rows at the end %v", states(s.Ctx, s.Pool, kind))
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (all resolved: %v)%s", r.Lost, r.DuplicateEffects, ok, timedOut(ok, pace))
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
