package faults_test

import (
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 3: two schedulers share the work; one is frozen with SIGSTOP
// for longer than the consumer's ack wait (its messages go to the other)
// while it may hold row locks or unpublished batches, then resumed: no
// due is doubled and none is lost.
func TestScenario03FreezeOneOfTwoSchedulers(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	n := harness.Size(1500, 20_000)
	freeze := time.Duration(harness.Size(8, 40)) * time.Second // ack wait is 3s
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "03 SIGSTOP one of two schedulers"}
	s.Start(harness.Scheduler)
	frozen := s.Start(harness.Scheduler + "-2")
	pace := s.Pace(r, assumeAll(r,
		requirement{"an eighth of the dues before the freeze", msgsPerDue * (n / 8), time.Minute},
		requirement{"every retry resolved (failed, scheduled, due, succeeded)", msgsPerRetry * n, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-03", time.Second, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	// Due times spread over a few seconds (retry-after hints), so both
	// instances emit dues while the load is still coming in.
	ids, msgs := failedItems(t, kind, "s03", n, func(i int) *contract.RetryAfter {
		return contract.RetryAfterDuration(time.Duration(1+i%4) * time.Second)
	})
	go func() {
		if _, err := harness.PublishAll(s.Ctx, s.JS, msgs[:n/2]); err != nil {
			t.Errorf("publish: %v", err)
		}
	}()
	if _, ok := harness.Eventually(s.Ctx, time.Minute, 2*time.Millisecond, func() bool {
		return owner.Count() >= n/8
	}); !ok {
		t.Fatalf("no dues: rows %v; %s", states(s.Ctx, s.Pool, kind), pace.Explain())
	}
	if err := frozen.Freeze(); err != nil {
		t.Fatal(err)
	}
	r.Fault("SIGSTOP %s for %s (%d dues received, rows %v)", frozen.Name, freeze, owner.Count(), states(s.Ctx, s.Pool, kind))
	if _, err := harness.PublishAll(s.Ctx, s.JS, msgs[n/2:]); err != nil {
		t.Fatalf("publish: %v", err)
	}
	succeededAtFreeze := states(s.Ctx, s.Pool, kind)["succeeded"]
	time.Sleep(freeze / 2) // the fault itself: the process stays stopped this long
	// What the frozen process holds in Postgres, and whether the other
	// instance waits on it.
	var idleInTx, lockWaits int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FILTER (WHERE state = 'idle in transaction'),
 count(*) FILTER (WHERE wait_event_type = 'Lock')
FROM pg_stat_activity WHERE datname = current_database() AND application_name <> 'faults' AND backend_type = 'client backend'`).Scan(&idleInTx, &lockWaits)
	var blocked, blocker string
	_ = s.Pool.QueryRow(s.Ctx, `SELECT left(a.query, 120), left(b.query, 120) FROM pg_stat_activity a
JOIN pg_stat_activity b ON b.pid = ANY (pg_blocking_pids(a.pid))
WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' LIMIT 1`).Scan(&blocked, &blocker)
	time.Sleep(freeze - freeze/2)
	succeededInFreeze := states(s.Ctx, s.Pool, kind)["succeeded"] - succeededAtFreeze
	r.Note("during the freeze: %d sessions idle in a transaction, %d sessions waiting on a lock; %d retries resolved by the other instance in %s",
		idleInTx, lockWaits, succeededInFreeze, freeze)
	if lockWaits > 0 {
		r.Note("waiting: %q, blocked by the frozen instance's open transaction (last statement %q)", blocked, blocker)
	}
	if err := frozen.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	r.Fault("SIGCONT %s (%d dues received, rows %v)", frozen.Name, owner.Count(), states(s.Ctx, s.Pool, kind))

	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 50*time.Millisecond, func() bool {
		return owner.Count() >= n && states(s.Ctx, s.Pool, kind)["succeeded"] == n
	})
	r.Recover = time.Since(thawed)
	dueCheck(t, s, owner, kind, ids, r)
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (all resolved: %v, rows %v)%s", r.Lost, r.DuplicateEffects, ok, states(s.Ctx, s.Pool, kind), timedOut(ok, pace))
	}
	t.Run("OtherInstanceProgressesDuringFreeze", func(t *testing.T) {
		// Liveness: the frozen instance keeps its open transaction and its
		// row locks, but the other one waits for a lock at most
		// RETRYD_SCHEDULER_LOCK_TIMEOUT (5s), hands that message back and
		// goes on with the rest.
		if succeededInFreeze == 0 {
			t.Fatalf("while %s was frozen for %s the other scheduler resolved 0 retries (%d sessions waiting on a lock; waiting %q, blocked by %q); %s",
				frozen.Name, freeze, lockWaits, blocked, blocker, pace.Explain())
		}
	})
}
