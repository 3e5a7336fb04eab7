package faults_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 8: a handler slower than the ack wait and poison items (an
// owner that always fails, a job that always fails, malformed messages):
// the slow job runs once, healthy items do not wait behind it, the poison
// items end exhausted with their reason and the malformed messages are
// terminated.
//
// The slow jobs hold 2 of the worker's 4 slots until the suite opens their
// gate, and the gate opens only when every healthy item and job is done
// (and not before the slow jobs ran for minSlow, ten ack waits). So "every
// healthy job finishes before the slow ones" is tested as a property, not
// as a race between the healthy backlog and a fixed sleep: a worker that
// let slow or poison work block the rest never finishes the healthy work,
// and fails at healthyDeadline, whatever the machine's speed.
func TestScenario08SlowHandlerAndPoison(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	nHealthy := harness.Size(300, 5000)
	nJobs := harness.Size(80, 2000)
	minSlow := time.Duration(harness.Size(10, 30)) * time.Second // the worker's ack wait is 3s
	healthyDeadline := time.Duration(harness.Size(3, 10)) * time.Minute
	const gate = "s08-slow"
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "08 slow handler and poison messages"}
	s.Start(harness.Scheduler)
	s.Start(harness.Worker, "FAULTWORKER_TYPES=work", "FAULTWORKER_CONCURRENCY=4")
	// Each healthy item costs 4 RETRIES messages (failed, scheduled, due,
	// succeeded), each healthy job 4 more plus 2 on JOBS: at the measured
	// store rate that is the least time the healthy work can take.
	healthyMsgs := 4*nHealthy + 4*nJobs
	pace := s.Pace(r, 500)
	s.Policy(kind, "", fastPolicy("faults-08", 500*time.Millisecond, 3))
	s.Policy(contract.KindJob, "work", fastPolicy("faults-08-work", 300*time.Millisecond, 3))
	owner := s.NewOwner(kind, func(d contract.DueData) harness.Outcome {
		return harness.Outcome{Fail: strings.HasPrefix(d.ID, "s08-poison")}
	})
	owner.Start()

	// Two slow jobs, three poison jobs, then healthy jobs that fail once.
	var jobMsgs []*nats.Msg
	addJob := func(id, payload string, timeout time.Duration) {
		m, err := contract.NewJobMsg("faults/load", contract.JobData{ID: id, JobType: "work", Attempt: 1, Payload: json.RawMessage(payload),
			TimeoutMS: timeout.Milliseconds()}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		jobMsgs = append(jobMsgs, m)
	}
	for i := range 2 {
		addJob(fmt.Sprintf("s08-slow-%d", i), fmt.Sprintf(`{"sleep_ms":%d,"gate":%q}`, minSlow.Milliseconds(), gate), 2*healthyDeadline)
	}
	for i := range 3 {
		addJob(fmt.Sprintf("s08-poisonjob-%d", i), `{"fail_attempts":1000}`, 0)
	}
	for i := range nJobs {
		addJob(fmt.Sprintf("s08-job-%04d", i), `{"fail_attempts":1}`, 0)
	}
	// Malformed messages where the scheduler and the worker consume.
	var bad []*nats.Msg
	for i := range 10 {
		bad = append(bad,
			&nats.Msg{Subject: fmt.Sprintf("retry.%s.failed.s08-bad-%d", kind, i), Data: []byte(`{"specversion":"1.0","id":"x"`), Header: nats.Header{}},
			&nats.Msg{Subject: "jobs.work", Data: []byte(`not json at all`), Header: nats.Header{}})
	}
	ids, msgs := failedItems(t, kind, "s08", nHealthy, nil)
	poisonIDs, poisonMsgs := failedItems(t, kind, "s08-poison", 5, nil)
	all := slices.Concat(jobMsgs, bad, poisonMsgs, msgs)
	if _, err := harness.PublishAll(s.Ctx, s.JS, all); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.Fault("2 jobs running at least %s and until every healthy item and job is done (ack wait 3s), 3 jobs and 5 items that always fail, 20 malformed messages, %d healthy items, %d healthy jobs",
		minSlow, nHealthy, nJobs)
	exhausted := func(k string, prefix string) map[string]string {
		out := map[string]string{}
		rows, err := s.Pool.Query(s.Ctx, `SELECT item_id, exhausted_reason FROM retries WHERE kind = $1 AND state = 'exhausted' AND item_id LIKE $2`, k, prefix+"%")
		if err != nil {
			return out
		}
		defer rows.Close()
		for rows.Next() {
			var id, reason string
			if rows.Scan(&id, &reason) == nil {
				out[id] = reason
			}
		}
		return out
	}
	effects := func(prefix string) int {
		var n int
		_ = s.Pool.QueryRow(s.Ctx, `SELECT count(DISTINCT job_id) FROM fault_job_effects WHERE job_id LIKE $1`, prefix+"%").Scan(&n)
		return n
	}
	// Healthy work first, while the slow jobs hold their slots.
	healthyTook, healthyDone := harness.Eventually(s.Ctx, healthyDeadline, 200*time.Millisecond, func() bool {
		return states(s.Ctx, s.Pool, kind)["succeeded"] == nHealthy && len(exhausted(kind, "s08-poison")) == 5 &&
			effects("s08-job-") == nJobs && len(exhausted(contract.KindJob, "s08-poisonjob-")) == 3
	})
	if !healthyDone {
		t.Errorf("healthy work did not finish in %s while 2 slow jobs held 2 of the worker's 4 slots: items %v, healthy job effects %d of %d; %s",
			healthyDeadline, states(s.Ctx, s.Pool, kind), effects("s08-job-"), nJobs, pace.Explain())
	}
	if effects("s08-slow-") != 0 {
		t.Errorf("a slow job finished before its gate opened")
	}
	// Then the slow jobs, at least minSlow after they started.
	if wait := minSlow - time.Since(start); wait > 0 {
		time.Sleep(wait)
	}
	if _, err := s.Pool.Exec(s.Ctx, `INSERT INTO fault_gates (name) VALUES ($1)`, gate); err != nil {
		t.Fatalf("open gate: %v", err)
	}
	gateOpened := time.Now()
	_, ok := harness.Eventually(s.Ctx, 2*time.Minute, 200*time.Millisecond, func() bool { return effects("s08-slow-") == 2 })
	ok = ok && healthyDone
	r.Recover = time.Since(start)
	dueCheck(t, s, owner, kind, ids, r)
	r.Sent += nJobs + 2 + 3 + len(poisonIDs)

	// Poison: exhausted with the reason.
	for id, reason := range exhausted(kind, "s08-poison") {
		if reason != contract.ExhaustedMaxRetries {
			t.Errorf("%s/%s exhausted with reason %q, want %q", kind, id, reason, contract.ExhaustedMaxRetries)
		}
	}
	for id, reason := range exhausted(contract.KindJob, "s08-poisonjob-") {
		if reason != contract.ExhaustedMaxRetries {
			t.Errorf("job %s exhausted with reason %q, want %q", id, reason, contract.ExhaustedMaxRetries)
		}
	}
	// The slow jobs ran once each although they outlived the ack wait
	// many times over, and every healthy job finished before they did.
	var slowRuns int
	var slowStart, slowDone, lastHealthy time.Time
	_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*), min(at) FROM fault_job_runs WHERE job_id LIKE 's08-slow-%'`).Scan(&slowRuns, &slowStart)
	_ = s.Pool.QueryRow(s.Ctx, `SELECT min(at) FROM fault_job_effects WHERE job_id LIKE 's08-slow-%'`).Scan(&slowDone)
	_ = s.Pool.QueryRow(s.Ctx, `SELECT max(at) FROM fault_job_effects WHERE job_id LIKE 's08-job-%'`).Scan(&lastHealthy)
	if slowRuns != 2 {
		r.DuplicateEffects += max(slowRuns-2, 0)
		t.Errorf("the 2 slow jobs ran %d times: a handler slower than the ack wait was redelivered", slowRuns)
	}
	if !lastHealthy.Before(slowDone) {
		t.Errorf("healthy jobs waited behind the slow ones: last healthy effect %s, first slow effect %s", lastHealthy, slowDone)
	}
	r.Note("healthy work done %s after the load (%d RETRIES messages; %s at the measured store rate); slow jobs held their slots %s (ack wait 3s), gate opened %s after the load",
		healthyTook.Round(time.Millisecond), healthyMsgs, pace.For(healthyMsgs).Round(time.Millisecond),
		slowDone.Sub(slowStart).Round(time.Millisecond), gateOpened.Sub(start).Round(time.Millisecond))
	// Lateness of healthy retries: how long after next_attempt_at the due
	// reached the owner (items) or attempt 2 started (jobs).
	var itemLate []time.Duration
	for _, e := range owner.Effects() {
		if !strings.HasPrefix(e.ID, "s08-poison") {
			itemLate = append(itemLate, e.FirstArrival.Sub(e.NextAttemptAt))
		}
	}
	var jobP50, jobP99, jobMax float64
	_ = s.Pool.QueryRow(s.Ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l), percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
FROM (SELECT extract(epoch FROM r.at - h.next_attempt_at) AS l FROM fault_job_runs r
      JOIN retry_history h ON h.kind = 'job' AND h.item_id = r.job_id AND h.attempt = r.attempt AND h.event IN ('scheduled', 'rescheduled')
      WHERE r.job_id LIKE 's08-job-%' AND r.attempt = 2) x`).Scan(&jobP50, &jobP99, &jobMax)
	p50, p99 := percentile(itemLate, 0.5), percentile(itemLate, 0.99)
	// The healthy items and jobs all come due within a second, so their
	// lateness is the time the stack takes to drain that burst, which the
	// broker bounds: nothing moves faster than NATS stores it. Lateness past
	// four times the store time of the whole healthy workload, plus 10 s
	// for the pipeline to start, means healthy work waited for something
	// else: a slow handler's slot, a poison item's batch.
	bound := 4*pace.For(healthyMsgs) + 10*time.Second
	r.Note("healthy item lateness p50 %s p99 %s; healthy job retry lateness p50 %.3fs p99 %.3fs max %.3fs (bound %s from the measured store rate); slow jobs ran %d times",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), jobP50, jobP99, jobMax, bound.Round(time.Millisecond), slowRuns)
	if p99 > bound || time.Duration(jobP99*float64(time.Second)) > bound {
		t.Errorf("healthy lateness p99 (items %s, jobs %.3fs) over the bound %s: healthy work waited for more than the broker; %s",
			p99.Round(time.Millisecond), jobP99, bound.Round(time.Millisecond), pace.Explain())
	}
	malformed := s.Metric(harness.Scheduler, "retryd_scheduler_malformed_total") + s.Metric(harness.Worker, "retryd_worker_malformed_total")
	r.Note("malformed messages terminated: %.0f of 20 (scheduler + worker metrics)", malformed)
	if malformed != 20 {
		t.Errorf("%.0f malformed messages counted as terminated, want 20", malformed)
	}
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (resolved %v)", r.Lost, r.DuplicateEffects, ok)
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
