package faults_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// Scenario 16 is issue 16's "recovery without stalls or gaps": a killed
// scheduler's share of RETRIES goes to its successor within seconds (a),
// and a purge of RETRIES before the scheduler has read job failures loses
// none of them, because the workers keep each failure until its decision
// and publish it again (b).

// decisionBound is the limit on the p99 delay from a fact to its
// decision around a kill of the scheduler.
const decisionBound = 3 * time.Second

// Scenario 16a: kill -9 of the scheduler under a steady load of first
// failures (1,000/s for 20 s; short: up to 300/s, derived from the
// machine's decision rate, for 8 s; either way on until 10 s after the
// kill), restarted after a 500 ms outage. The
// delay of a fact is from its failed fact's stream timestamp to its
// scheduled fact's stream timestamp (both by nats-server's clock), counted
// from the restart: decision − max(publish, restart), restart being the
// moment the test starts the process again, so its start-up counts but
// not the outage the test imposes. Asserted: p99 under 3 s for the facts
// published in the 10 s after the kill, and for the facts the killed
// process left undecided (published before the kill, decided after it);
// every fact decided exactly once. The p99 bound is asserted in the full
// suite (make faults) only: in the short run make test gives it, the
// scenario shares two cores with every other package, and its delays
// measure that machine's load at that moment (3.5 s was seen on a fresh
// clone), so the short run reports them and asserts what does not
// depend on speed: nothing lost, nothing decided twice.
//
// With the scheduler's consumer as it was before issue 16 (a 30 s ack
// wait, MaxAckPending 1000) this fails: just before the kill a
// burst hands the scheduler as much as one instance holds (three consume
// batches), and the kill waits until it holds at least one batch
// unacked. Those facts wait out the 30 s ack wait (run with
// RETRYD_SCHEDULER_ACK_WAIT=30s and RETRYD_SCHEDULER_MAX_ACK_PENDING=1000:
// p99 29.6 s from the restart for the undecided facts), and when they
// fill MaxAckPending the consumer hands the restarted instance nothing
// meanwhile either, so the facts published after the kill stall too.
// The in-progress acks are what make a 2 s ack wait safe for a slow batch
// of a live instance; this scenario checks the takeover it buys.
func TestScenario16KillSchedulerUnderSteadyLoad(t *testing.T) {
	t.Parallel()
	const (
		kind = "ft16"
		// outage is how long the test keeps the scheduler down on purpose.
		outage = 500 * time.Millisecond
		// window is the "10 s after the kill".
		window = 10 * time.Second
	)
	target := float64(harness.Size(300, 1000))
	span := time.Duration(harness.Size(8, 20)) * time.Second
	burst := 3 * scheduler.DefaultConsumeBatch
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "16a kill -9 scheduler under steady failures"}
	sched := s.Start(harness.Scheduler)
	// floor is the lowest load the scenario runs: the 1,000/s when
	// the machine decides twice that, else what it gives, from 100/s (the
	// fault suite runs its scenarios side by side, so the full run on 2
	// cores may get less than 1,000/s; the report says so). Each item
	// stores its failure and its decision while the load runs.
	floor := 100.0
	if !harness.Full() {
		// The short run measures nothing against a bound, so any rate
		// the machine sustains will do.
		floor = 10
	}
	pace := s.Pace(r, assumeAll(r,
		requirement{"steady load: failed and scheduled of every item as it comes", 2 * int(floor*span.Seconds()), span},
	))
	// The load must be one the scheduler decides with room to spare, or
	// the backlog grows whatever the recovery does: the rate is at most
	// half the decision rate this machine gives right now (measured on a
	// calibration kind), and at least floor.
	calN := harness.Size(600, 3000)
	decided := decisionRate(t, s, calN)
	rate := min(target, decided/2)
	r.Note("decision rate (calibration, %d failures): %.0f/s; steady load %.0f failures/s for %s (target %.0f/s)", calN, decided, rate, span, target)
	if rate < target {
		r.Note("load below the target of %.0f/s: the scheduler decides %.0f failures/s on this machine right now", target, decided)
	}
	if rate < floor {
		t.Fatalf("machine too slow for scenario 16a: the scheduler decided %.0f failures/s, and a steady load of %.0f/s needs twice that; %s",
			decided, floor, pace.Explain())
	}
	// An hour's delay: every item stays scheduled, so each has one
	// decision and nothing else follows it.
	s.Policy(kind, "", fastPolicy("faults-16a", time.Hour, 3))

	// The load runs span, and on until window after the kill: on a busy
	// machine the burst and the wait for a held batch can take longer than
	// span, and a kill after the load would measure nothing. Enough
	// failures are made for that; the ones published are a prefix.
	steady := int(rate * span.Seconds())
	most := int(rate * (span + window + 20*time.Second).Seconds())
	ids, msgs := failedItems(t, kind, "s16", most, nil)
	burstIDs, burstMsgs := failedItems(t, kind, "s16burst", burst, nil)

	// The publisher hands out the failures at rate, each tick what is due
	// by then, every batch acknowledged (PublishAll) so that none is lost
	// on the suite's side; it closes half once half the steady load is
	// out, and stops at span or at stopAt (once set), whichever is later.
	half := make(chan struct{})
	var stopAt atomic.Int64
	type loadEnd struct {
		sent int
		at   time.Time
		err  error
	}
	pubDone := make(chan loadEnd, 1)
	start := time.Now()
	go func() {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		sent := 0
		for sent < most {
			select {
			case <-s.Ctx.Done():
				pubDone <- loadEnd{sent: sent, at: time.Now(), err: fmt.Errorf("publish steady load: %w", s.Ctx.Err())}
				return
			case <-tick.C:
			}
			if time.Since(start) >= span && time.Now().UnixNano() >= stopAt.Load() && stopAt.Load() != 0 {
				break
			}
			due := min(most, int(time.Since(start).Seconds()*rate))
			if due <= sent {
				continue
			}
			batch := msgs[sent:due]
			if sent < steady/2 && due >= steady/2 {
				close(half)
			}
			sent = due
			wg.Go(func() {
				if _, err := harness.PublishAll(s.Ctx, s.JS, batch); err != nil {
					mu.Lock()
					first = cmp.Or(first, fmt.Errorf("publish steady load: %w", err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		pubDone <- loadEnd{sent: sent, at: time.Now(), err: first}
	}()

	select {
	case <-half:
	case end := <-pubDone:
		t.Fatalf("publisher ended before half the load: %v", end.err)
	}
	// The burst gives the scheduler as much as it holds; the kill comes
	// once it holds at least a consume batch unacked (or after 10 s, and
	// the report says how many it held).
	if _, err := harness.PublishAll(s.Ctx, s.JS, burstMsgs); err != nil {
		t.Fatalf("publish burst: %v", err)
	}
	held := 0
	harness.Eventually(s.Ctx, 10*time.Second, 5*time.Millisecond, func() bool {
		held = ackPending(s)
		return held >= scheduler.DefaultConsumeBatch
	})
	killAt := time.Now()
	stopAt.Store(killAt.Add(window).UnixNano())
	if err := sched.Kill9(); err != nil {
		t.Fatal(err)
	}
	r.Fault("kill -9 scheduler %s into a %.0f/s load, holding %d facts unacked (after a burst of %d)",
		killAt.Sub(start).Round(time.Millisecond), rate, held, burst)
	// The one fixed wait: the outage the scenario imposes.
	time.Sleep(outage)
	restartAt := time.Now()
	s.Restart(harness.Scheduler)
	readyAt := time.Now()
	r.Fault("restart after %s down; ready %s after the restart", restartAt.Sub(killAt).Round(time.Millisecond), readyAt.Sub(restartAt).Round(time.Millisecond))

	end := <-pubDone
	if end.err != nil {
		t.Fatal(end.err)
	}
	ids = append(ids[:end.sent], burstIDs...)
	// Every item decided: at the measured decision rate the backlog takes
	// seconds; the wait allows a minute more.
	_, ok := harness.Eventually(s.Ctx, bounded(time.Minute+pace.For(2*len(ids))), 20*time.Millisecond, func() bool {
		return states(s.Ctx, s.Pool, kind)["scheduled"] >= len(ids)
	})
	// The outbox relay publishes each decision after its commit: read the
	// stream once every item's decision is there, or an item decided in
	// Postgres but not yet published counts as lost (a loaded run read 381
	// of 3,225 so, with every row scheduled).
	if ok {
		_, ok = harness.Eventually(s.Ctx, bounded(time.Minute+pace.For(len(ids))), 50*time.Millisecond, func() bool {
			n, err := harness.SubjectsStored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Scheduled))
			return err == nil && n >= len(ids)
		})
	}

	failed, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Failed))
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Scheduled))
	if err != nil {
		t.Fatal(err)
	}
	published := firstByItem(failed)
	decidedAt := firstByItem(decisions)
	decisionCopies := countByItem(decisions)
	history := historyCounts(t, s, kind)

	r.Sent = len(ids)
	var undecided, aroundKill, afterRestart []time.Duration
	var aroundRaw []time.Duration
	var backlogCleared time.Time
	for _, id := range ids {
		pub, okPub := published[id]
		dec, okDec := decidedAt[id]
		h := history[id]
		if !okPub || !okDec || h.scheduled == 0 {
			r.Lost++
			continue
		}
		r.DuplicateEffects += max(0, h.scheduled-1) + max(0, decisionCopies[id]-1)
		if pub.Before(readyAt) && dec.After(backlogCleared) {
			backlogCleared = dec
		}
		fromRestart := dec.Sub(later(pub, restartAt))
		switch {
		case pub.Before(killAt) && dec.After(killAt):
			undecided = append(undecided, fromRestart)
		case !pub.Before(killAt) && pub.Before(killAt.Add(window)):
			aroundKill = append(aroundKill, fromRestart)
			aroundRaw = append(aroundRaw, dec.Sub(pub))
			if !pub.Before(readyAt) {
				afterRestart = append(afterRestart, dec.Sub(pub))
			}
		}
	}
	r.Absorbed = int(s.Metric(harness.Scheduler, "retryd_scheduler_duplicate_total"))
	r.Recover = backlogCleared.Sub(restartAt)
	r.Note("facts published in the %s after the kill (%d; the load ran %s past it): publish to decision p50 %s, p99 %s, max %s",
		window, len(aroundKill), end.at.Sub(killAt).Round(time.Millisecond), pct(aroundRaw, 50), pct(aroundRaw, 99), pct(aroundRaw, 100))
	r.Note("  the same, counted from the restart (decision - max(publish, restart)): p50 %s, p99 %s, max %s (bound %s)",
		pct(aroundKill, 50), pct(aroundKill, 99), pct(aroundKill, 100), decisionBound)
	r.Note("  of them published after the restarted scheduler was ready (%d): publish to decision p50 %s, p99 %s, max %s",
		len(afterRestart), pct(afterRestart, 50), pct(afterRestart, 99), pct(afterRestart, 100))
	r.Note("facts the killed process left undecided (%d, published before the kill): decision counted from the restart p50 %s, p99 %s, max %s (bound %s)",
		len(undecided), pct(undecided, 50), pct(undecided, 99), pct(undecided, 100), decisionBound)
	r.Note("recover: from the restart to the decision of the last fact published before the restarted scheduler was ready")
	r.Note("stored: %d failed, %d scheduled for %d items; redelivered facts the restarted scheduler's inbox absorbed: %d",
		len(failed), len(decisions), len(ids), r.Absorbed)
	r.Note("rows at the end %v", states(s.Ctx, s.Pool, kind))
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate decisions %d (all decided: %v)%s", r.Lost, r.DuplicateEffects, ok, timedOut(ok, pace))
	}
	if len(aroundKill) == 0 {
		t.Fatalf("no fact published after the kill: nothing measured")
	}
	if !harness.Full() {
		return
	}
	if p := pct(aroundKill, 99); p >= decisionBound {
		t.Errorf("p99 delay to decision of the facts published in the %s after the kill, counted from the restart: %s, over %s; %s",
			window, p, decisionBound, pace.Explain())
	}
	if p := pct(undecided, 99); p >= decisionBound {
		t.Errorf("p99 delay to decision of the %d facts the killed scheduler left undecided, counted from the restart: %s, over %s; %s",
			len(undecided), p, decisionBound, pace.Explain())
	}
}

// Scenario 16b: a purge of RETRIES before the scheduler has read job
// failures, with the fault worker as a separate process. The scheduler is
// stopped; N jobs (10,000; short 1,000) fail their first attempt; once
// every failed fact is on RETRIES (and kept by the worker), RETRIES is
// purged and the scheduler started: every job gets exactly one scheduled
// decision for attempt 2, in Postgres and on the stream.
//
// RETRIES' duplicate window is shrunk to 1 s and the worker republishes
// after 1.5 s (FAULTWORKER_REPUBLISH_AFTER) instead of 2 and 3 minutes, so
// the run takes seconds; the order of the two is what matters, and the
// SDK refuses a RepublishAfter inside the window.
//
// Without the worker's pending set (FAULTWORKER_PENDING_LIMIT=-1, the SDK
// before issue 16) this fails: the worker acked each job once its failed
// fact was stored, the purge removes every fact, and nothing publishes
// them again: the scheduler decides none (run so: lost 1,000 of 1,000).
func TestScenario16PurgeBeforeSchedulerReadsJobFailures(t *testing.T) {
	t.Parallel()
	const (
		jobType        = "work"
		republishAfter = 1500 * time.Millisecond
	)
	n := harness.Size(1000, 10_000)
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "16b purge RETRIES before the scheduler reads"}
	// The scheduler creates the streams, its consumer and the policy, and
	// stops: from then on it has read nothing of this load.
	sched := s.Start(harness.Scheduler)
	// Each job: JOBS, its failure, the failure again after the purge, its
	// decision.
	pace := s.Pace(r, assumeAll(r,
		requirement{"every job failed, republished and decided", 4 * n, bounded(3 * time.Minute)},
	))
	// An hour's delay: every job stays scheduled for attempt 2.
	s.Policy(contract.KindJob, jobType, fastPolicy("faults-16b", time.Hour, 3))
	if err := sched.Term(10 * time.Second); err != nil {
		t.Fatalf("stop scheduler: %v", err)
	}
	stream, err := s.JS.Stream(s.Ctx, contract.StreamRetries)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.Duplicates = time.Second
	if stream, err = s.JS.UpdateStream(s.Ctx, cfg); err != nil {
		t.Fatalf("shrink the duplicate window: %v", err)
	}
	// The worker reads the window at its start.
	s.Start(harness.Worker, "FAULTWORKER_TYPES="+jobType, "FAULTWORKER_CONCURRENCY=32",
		"FAULTWORKER_REPUBLISH_AFTER="+republishAfter.String())

	ids := make([]string, n)
	jobs := make([]*natsMsg, n)
	for i := range n {
		ids[i] = fmt.Sprintf("s16-job-%06d", i)
		m, err := contract.NewJobMsg("faults/load", contract.JobData{ID: ids[i], JobType: jobType, Attempt: 1,
			Payload: json.RawMessage(`{"fail_attempts":1}`)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		jobs[i] = m
	}
	loadStart := time.Now()
	if _, err := harness.PublishAll(s.Ctx, s.JS, jobs); err != nil {
		t.Fatalf("publish jobs: %v", err)
	}
	// Every failure on the stream, not only kept: a publish still in
	// flight at the purge would land after it and need no republish.
	failedFilter := contract.RetryFilter(contract.KindJob, contract.Failed)
	onStream := func() int {
		info, err := stream.Info(s.Ctx, jetstream.WithSubjectFilter(failedFilter))
		if err != nil {
			return -1
		}
		return len(info.State.Subjects)
	}
	kept := func() int { return int(s.Metric(harness.Worker, "retryd_worker_pending_facts")) }
	if _, ok := harness.Eventually(s.Ctx, bounded(time.Minute+pace.For(2*n)), 50*time.Millisecond, func() bool {
		return onStream() == n && kept() == n
	}); !ok {
		t.Fatalf("job failures not all on RETRIES and kept: %d stored, %d kept of %d; %s", onStream(), kept(), n, pace.Explain())
	}
	r.Note("%d jobs failed, each failure stored and kept by the worker, in %s", n, time.Since(loadStart).Round(time.Millisecond))
	if err := stream.Purge(s.Ctx); err != nil {
		t.Fatalf("purge: %v", err)
	}
	purged := time.Now()
	r.Fault("purge RETRIES with %d job failures the scheduler had not read", n)
	s.Restart(harness.Scheduler)
	r.Fault("start the scheduler %s after the purge", time.Since(purged).Round(time.Millisecond))

	// Decided: every job scheduled for attempt 2 and its worker has seen
	// the decision. The republished failures and their decisions are 2n
	// messages; the wait allows a minute more.
	scheduled := func() int {
		var c int
		_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM retries WHERE kind = $1 AND state = 'scheduled' AND attempt = 2`, contract.KindJob).Scan(&c)
		return c
	}
	_, ok := harness.Eventually(s.Ctx, bounded(time.Minute+pace.For(2*n)), 50*time.Millisecond, func() bool {
		return scheduled() >= n && kept() == 0
	})
	r.Recover = time.Since(purged)
	// Decided and seen is not yet stored: the worker sees a decision on
	// its core subscription as the relay publishes it, which can come
	// before RETRIES has stored it (CI run X read 982 of 1,000 decisions
	// at this point). A decision is stored once its outbox row is gone:
	// the relay deletes a row after the PubAck.
	if _, stored := harness.Eventually(s.Ctx, bounded(30*time.Second), 50*time.Millisecond, func() bool {
		var c int
		_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM outbox WHERE owner = $1`, scheduler.Owner).Scan(&c)
		return c == 0
	}); !stored {
		r.Note("the scheduler's outbox still held decisions after 30s")
	}

	history := historyCounts(t, s, contract.KindJob)
	decisions, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(contract.KindJob, contract.Scheduled))
	if err != nil {
		t.Fatal(err)
	}
	var rows, other int
	if err := s.Pool.QueryRow(s.Ctx, `SELECT count(*), count(*) FILTER (WHERE NOT (state = 'scheduled' AND attempt = 2)) FROM retries WHERE kind = $1`,
		contract.KindJob).Scan(&rows, &other); err != nil {
		t.Fatal(err)
	}
	r.Sent = n
	onStreamByID := countByItem(decisions)
	lostPG, lostStream := 0, 0
	for _, id := range ids {
		h := history[id]
		if h.scheduled == 0 {
			lostPG++
		}
		if onStreamByID[id] == 0 {
			lostStream++
		}
		r.DuplicateEffects += max(0, h.scheduled-1) + max(0, h.failed-1) + max(0, onStreamByID[id]-1)
	}
	r.Lost = max(lostPG, lostStream)
	republished := int(s.Metric(harness.Worker, "retryd_worker_republished_total"))
	r.Absorbed = int(s.Metric(harness.Scheduler, "retryd_scheduler_duplicate_total"))
	r.Note("worker republished %d failures after the purge (republish after %s, duplicate window 1s); scheduler inbox absorbed %d",
		republished, republishAfter, r.Absorbed)
	r.Note("retries rows %d (%d not scheduled for attempt 2); scheduled decisions: %d in retry_history, %d on RETRIES; jobs without one: %d in Postgres, %d on the stream",
		rows, other, sumScheduled(history), len(decisions), lostPG, lostStream)
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 || rows != n || other != 0 {
		t.Fatalf("lost %d, duplicate decisions %d, rows %d of %d (%d not scheduled for attempt 2), all decided and seen: %v%s",
			r.Lost, r.DuplicateEffects, rows, n, other, ok, timedOut(ok, pace))
	}
}

// ackPending is how many facts the scheduler's consumer has handed out
// unacked (-1 if it cannot say).
func ackPending(s *harness.System) int {
	c, err := s.JS.Consumer(s.Ctx, contract.StreamRetries, scheduler.ConsumerName)
	if err != nil {
		return -1
	}
	info, err := c.Info(s.Ctx)
	if err != nil {
		return -1
	}
	return info.NumAckPending
}

// firstByItem maps each item id to the stream timestamp of its first
// stored message.
func firstByItem(msgs []harness.StoredMsg) map[string]time.Time {
	out := make(map[string]time.Time, len(msgs))
	for _, m := range msgs {
		p, err := contract.ParseRetrySubject(m.Subject)
		if err != nil {
			continue
		}
		if at, ok := out[p.ID]; !ok || m.Time.Before(at) {
			out[p.ID] = m.Time
		}
	}
	return out
}

// countByItem counts the stored messages of each item id.
func countByItem(msgs []harness.StoredMsg) map[string]int {
	out := make(map[string]int, len(msgs))
	for _, m := range msgs {
		if p, err := contract.ParseRetrySubject(m.Subject); err == nil {
			out[p.ID]++
		}
	}
	return out
}

// itemHistory is what retry_history holds for one item.
type itemHistory struct{ failed, scheduled int }

// historyCounts reads, per item of kind, its failed and scheduled rows in
// retry_history: one each for an item failed once and decided once.
func historyCounts(t *testing.T, s *harness.System, kind string) map[string]itemHistory {
	t.Helper()
	rows, err := s.Pool.Query(s.Ctx, `SELECT item_id, count(*) FILTER (WHERE event = 'failed'), count(*) FILTER (WHERE event = 'scheduled')
		FROM retry_history WHERE kind = $1 GROUP BY item_id`, kind)
	if err != nil {
		t.Fatalf("read retry_history: %v", err)
	}
	defer rows.Close()
	out := map[string]itemHistory{}
	for rows.Next() {
		var id string
		var h itemHistory
		if err := rows.Scan(&id, &h.failed, &h.scheduled); err != nil {
			t.Fatalf("read retry_history: %v", err)
		}
		out[id] = h
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read retry_history: %v", err)
	}
	return out
}

func sumScheduled(h map[string]itemHistory) int {
	n := 0
	for _, v := range h {
		n += v.scheduled
	}
	return n
}

// pct is the p-th percentile of ds (nearest rank; 100 is the maximum), 0
// for none.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	i := max(0, (len(sorted)*p+99)/100-1)
	return sorted[i].Round(time.Millisecond)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
