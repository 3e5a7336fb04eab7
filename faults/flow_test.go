package faults_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// flow is the whole pipeline under load: events posted to ingress through
// a rate-limited source (deferrals), a throttled trigger launching runs
// (held deliveries), and jobs for the fault worker whose first attempt
// fails (job retries through the due router).
type flow struct {
	s       *harness.System
	source  string
	sender  *harness.EventSender
	events  []map[string]any
	jobIDs  []string
	jobMsgs []*natsMsg
}

// startFlow starts every service and configures the source, the trigger
// and the policies.
func startFlow(t *testing.T, s *harness.System, prefix string, nEvents, nJobs int, workerEnv ...string) *flow {
	t.Helper()
	s.Start(harness.Scheduler)
	s.Start(harness.Ingress)
	s.Start(harness.Triggers)
	s.Start(harness.Worker, append([]string{"FAULTWORKER_TYPES=work"}, workerEnv...)...)
	f := &flow{s: s, source: "shop"}
	// Throttled attempts use retries: allow plenty.
	for _, kind := range []string{contract.KindEvent, contract.KindEventTrigger} {
		s.Policy(kind, "", map[string]any{"name": "faults-" + kind, "max_retries": 1000, "base_delay_ms": 300,
			"max_delay_ms": 2000, "jitter": "none"})
	}
	s.Policy(contract.KindJob, "work", map[string]any{"name": "faults-work", "max_retries": 5, "base_delay_ms": 300,
		"max_delay_ms": 2000, "jitter": "none"})
	s.MustDo(http.MethodPut, s.URL(harness.Ingress)+"/v1/sources/"+f.source,
		map[string]any{"rate_limit": max(20, nEvents/10), "rate_window": "1s"}, http.StatusOK)
	s.MustDo(http.MethodPost, s.URL(harness.Triggers)+"/v1/triggers", map[string]any{
		"id": "orders", "name": "orders", "source": f.source, "event_type": "order.created",
		"throttle": map[string]any{"limit": max(15, nEvents/15), "window": "1s"}, "workflow": "fulfil",
	}, http.StatusCreated)
	f.sender = &harness.EventSender{Sys: s, URL: s.URL(harness.Ingress)}
	for i := range nEvents {
		f.events = append(f.events, map[string]any{"id": fmt.Sprintf("%s-ev-%06d", prefix, i), "source": f.source,
			"type": "order.created", "data": map[string]any{"n": i}})
	}
	for i := range nJobs {
		id := fmt.Sprintf("%s-job-%06d", prefix, i)
		m, err := contract.NewJobMsg("faults/load", contract.JobData{ID: id, JobType: "work", Attempt: 1,
			Payload: json.RawMessage(`{"fail_attempts":1}`)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		f.jobIDs = append(f.jobIDs, id)
		f.jobMsgs = append(f.jobMsgs, m)
	}
	return f
}

// load sends everything over span; the returned channel reports the end.
func (f *flow) load(span time.Duration) <-chan error {
	done := make(chan error, 2)
	f.sender.Every = span / time.Duration(max(1, len(f.events)))
	go func() { done <- f.sender.SendAll(f.s.Ctx, f.events, 8) }()
	go func() {
		step := max(1, len(f.jobMsgs)/20)
		for i := 0; i < len(f.jobMsgs); i += step {
			time.Sleep(span / 20)
			if _, err := harness.PublishAll(f.s.Ctx, f.s.JS, f.jobMsgs[i:min(i+step, len(f.jobMsgs))]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// flowResult is what check found.
type flowResult struct {
	done                                 bool
	events, admitted, runs, jobs, jobsOK int
	lost, dups, absorbed                 int
	detail                               []string
}

// check compares the effects with the load: each accepted event stored
// once on EVENTS and launching exactly one run, each job's effect
// recorded once (by the attempt that succeeded).
func (f *flow) check(t *testing.T) flowResult {
	t.Helper()
	s := f.s
	var res flowResult
	accepted := f.sender.Accepted()
	res.events = len(accepted)
	evMsgs, err := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events.>")
	if err != nil {
		res.detail = append(res.detail, err.Error())
		return res
	}
	evCounts := harness.CountByMsgID(evMsgs)
	res.admitted = len(evCounts)
	runMsgs, err := harness.Stored(s.Ctx, s.JS, contract.StreamRuns, "runs.*.requested.*")
	if err != nil {
		res.detail = append(res.detail, err.Error())
		return res
	}
	runCounts := harness.CountByMsgID(runMsgs)
	runsPerEvent := map[string]int{}
	for _, m := range runMsgs {
		_, d, err := contract.DecodeRunRequested(m.Subject, m.Data)
		if err == nil {
			runsPerEvent[d.EventID]++
		}
	}
	res.runs = len(runCounts)
	jobMsgs, err := harness.Stored(s.Ctx, s.JS, contract.StreamJobs, "jobs.*")
	if err != nil {
		res.detail = append(res.detail, err.Error())
		return res
	}
	jobCounts := harness.CountByMsgID(jobMsgs)

	effects := map[string]int{}
	rows, err := s.Pool.Query(s.Ctx, `SELECT job_id, count(*) FROM fault_job_effects GROUP BY job_id`)
	if err == nil {
		for rows.Next() {
			var id string
			var n int
			if rows.Scan(&id, &n) == nil {
				effects[id] = n
			}
		}
		rows.Close()
	}
	var redundantRuns int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM fault_job_runs GROUP BY job_id, attempt) x`).Scan(&redundantRuns)

	lostEvents, lostRuns, lostJobs := 0, 0, 0
	for id := range accepted {
		if evCounts[id] == 0 {
			lostEvents++
		}
		if runsPerEvent[id] == 0 {
			lostRuns++
		}
	}
	for _, id := range f.jobIDs {
		if effects[id] == 0 {
			lostJobs++
		}
	}
	res.jobs, res.jobsOK = len(f.jobIDs), len(f.jobIDs)-lostJobs
	res.lost = lostEvents + lostRuns + lostJobs
	res.dups = harness.Duplicates(evCounts) + harness.Duplicates(runCounts) + harness.Duplicates(jobCounts)
	for _, n := range runsPerEvent {
		if n > 1 {
			res.dups += n - 1
		}
	}
	for _, n := range effects {
		if n > 1 {
			res.dups += n - 1
		}
	}
	res.absorbed = redundantRuns + int(f.sender.Duplicate.Load()) +
		s.Wire.Extra(evCounts, func(id string) bool { return !strings.Contains(id, ":") }) +
		s.Wire.Extra(runCounts, func(id string) bool { return strings.HasPrefix(id, "run-") }) +
		s.Wire.Extra(jobCounts, func(id string) bool { return strings.HasPrefix(id, "job") })
	res.done = res.lost == 0 && res.events == len(f.events)
	res.detail = append(res.detail, fmt.Sprintf(
		"events: %d accepted, %d admitted (%d lost); runs: %d (%d events without one); jobs: %d of %d with an effect; redundant job executions %d (same attempt run again after a kill, absorbed by the idempotency key)",
		res.events, res.admitted, lostEvents, res.runs, lostRuns, res.jobsOK, res.jobs, redundantRuns))
	return res
}
