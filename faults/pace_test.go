package faults_test

import (
	"time"

	"github.com/retryd/retryd/faults/harness"
)

// What one unit of work stores on the streams, as the scenarios count it
// to derive the NATS store rate they assume (docs/reliability.md). Every
// message is one fsync with sync_interval: always, so these counts, not
// the number of items, are what the broker's speed bounds.
const (
	// msgsPerRetry: one retry cycle of an item its owner failed once, on
	// RETRIES: failed, scheduled, due, succeeded.
	msgsPerRetry = 4
	// msgsPerDue: what must be stored before the owner sees an item's
	// due: failed, scheduled, due.
	msgsPerDue = 3
	// msgsPerDeferral: one deferral of an event by a source or a trigger
	// throttle, on RETRIES: failed (or failed again), scheduled (or
	// rescheduled), due, succeeded (the last one only once; counting it
	// every cycle keeps the estimate on the high side).
	msgsPerDeferral = msgsPerRetry
	// msgsPerAdmission: an event through ingress admitted at once: INGEST,
	// EVENTS.
	msgsPerAdmission = 2
	// msgsPerJob: a job whose first attempt fails: JOBS, its retry cycle
	// (failed, scheduled, due, succeeded), JOBS again for attempt 2.
	msgsPerJob = 1 + msgsPerRetry + 1
	// msgsPerFlowEvent: an event of the flow (flow_test.go): INGEST, one
	// deferral by the rate-limited source, EVENTS, one deferral by the
	// throttled trigger, the run on RUNS.
	msgsPerFlowEvent = 1 + msgsPerDeferral + 1 + msgsPerDeferral + 1
)

// assume is the NATS store rate (msg/s) a phase that must move msgs
// stream messages within the limit assumes. StoreRate measures the broker
// alone, on an idle stream; under a scenario the services, Postgres and
// the suite share the 2 cores of the CI machine with nats-server, so a
// loaded stack moves about half or less of what the broker stores alone:
// hence the factor 2.
func assume(msgs int, within time.Duration) float64 {
	return 2 * float64(msgs) / within.Seconds()
}

// requirement is one phase of a scenario whose wait depends on speed:
// it must move msgs stream messages within a limit.
type requirement struct {
	phase  string
	msgs   int
	within time.Duration
}

// assumeAll notes each requirement and its rate in r and returns the
// largest: the store rate the scenario assumes, to give to Pace.
func assumeAll(r *harness.Report, reqs ...requirement) float64 {
	most := 0.0
	for _, q := range reqs {
		rate := assume(q.msgs, q.within)
		r.Note("speed assumption: %s: %d stream messages within %s, so at least %.0f msg/s (x2 for the loaded stack)",
			q.phase, q.msgs, q.within.Round(time.Second), rate)
		most = max(most, rate)
	}
	return most
}

// deferrals is about how many times an event a source (or a trigger
// throttle) defers goes through the scheduler while the backlog drains
// over span: the first retries come sooner, then one every maxDelay.
func deferrals(span, maxDelay time.Duration) int {
	return 2 + int(span/maxDelay)
}

// timedOut is what a scenario's final failure adds when its last wait
// timed out: the pace sentence, so the reader knows at once whether the
// machine was fast enough. Lost items or duplicates with every wait met
// are a defect whatever the speed, and add nothing.
func timedOut(ok bool, p harness.Pace) string {
	if ok {
		return ""
	}
	return "; " + p.Explain()
}

// bounded is what a wait of d really gets: every wait of a scenario is
// also bounded by the scenario's context (scenarioTimeout from setup).
func bounded(d time.Duration) time.Duration {
	return min(d, scenarioTimeout())
}
