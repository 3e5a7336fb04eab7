package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// Scenario 5: the broker loses what it held: RETRIES purged, the
// scheduler's durable consumer deleted, the whole RETRIES stream deleted.
// Pending retries live in Postgres, so every one still comes due; the
// stream and the consumer are recreated by reconciliation.
func TestScenario05PurgeAndDelete(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	n := harness.Size(500, 20_000)
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "05 purge RETRIES, delete consumer, delete stream"}
	s.Start(harness.Scheduler)
	pace := s.Pace(r, 300)
	owner := s.NewOwner(kind, nil)
	owner.Start()
	stream, err := s.JS.Stream(s.Ctx, contract.StreamRetries)
	if err != nil {
		t.Fatal(err)
	}
	// The purge and the delete must hit while every item is pending: the
	// first item decided must not come due before the last is decided. So
	// the delay is derived from the decision rate this machine gives right
	// now, measured on a calibration kind the owner does not consume.
	rate := decisionRate(t, s, n/10)
	delay := max(time.Duration(harness.Size(6, 30))*time.Second,
		(3*time.Duration(float64(n)/rate*float64(time.Second)) + 10*time.Second).Round(time.Second))
	r.Note("decision rate (calibration, %d failures): %.0f/s; retry delay derived from it: %s", n/10, rate, delay)
	if delay > scenarioTimeout()/4 {
		t.Fatalf("machine too slow for scenario 05: the scheduler decided %.0f failures/s, and %d pending items would need a %s delay (over %s); %s",
			rate, n, delay, scenarioTimeout()/4, pace.Explain())
	}
	s.Policy(kind, "", fastPolicy("faults-05", delay, 3))
	var all []string
	// pending waits until every item of ids is scheduled at once; past the
	// delay the first ones come due, so a slower decision rate fails here
	// with the figure instead of testing nothing.
	pending := func(ids []string, since time.Time) {
		t.Helper()
		if _, ok := harness.Eventually(s.Ctx, delay-time.Since(since), 10*time.Millisecond, func() bool {
			return states(s.Ctx, s.Pool, kind)["scheduled"] >= len(ids)
		}); !ok {
			rows := states(s.Ctx, s.Pool, kind)
			t.Fatalf("items not all pending within the %s delay: rows %v; the scheduler decided %.0f/s here against %.0f/s in calibration; %s",
				delay, rows, float64(rows["scheduled"]+rows["due"]+rows["succeeded"])/time.Since(since).Seconds(), rate, pace.Explain())
		}
		r.Note("%d items pending %s after their first publish (%.0f decisions/s)", len(ids), time.Since(since).Round(time.Millisecond),
			float64(len(ids))/time.Since(since).Seconds())
	}
	// comeDue waits for the owner to have every item's due. Past the
	// delay the stack must store each item's due and its owner's
	// succeeded (msgsAfterDue): the wait allows that at the rate the
	// scenario assumes, halved for the loaded stack (as assume counts),
	// and never less than 2 minutes. A miss says how fast the dues came,
	// so a slow machine reads as one.
	comeDue := func(ids []string) time.Duration {
		t.Helper()
		const msgsAfterDue = 2
		slack := max(2*time.Minute, time.Duration(2*float64(msgsAfterDue*len(ids))/pace.Assumed*float64(time.Second)).Round(time.Second))
		since := time.Now()
		took, ok := harness.Eventually(s.Ctx, bounded(delay+slack), 20*time.Millisecond, func() bool {
			for _, id := range ids {
				if !owner.Has(id, 2) {
					return false
				}
			}
			return true
		})
		if !ok {
			got := 0
			for _, id := range ids {
				if owner.Has(id, 2) {
					got++
				}
			}
			t.Errorf("not every pending retry came due within the %s delay plus %s: the owner has %d of %d dues (%.0f a second since the delay); rows %v; %s",
				delay, slack, got, len(ids), float64(got)/max(time.Since(since)-delay, time.Second).Seconds(), states(s.Ctx, s.Pool, kind), pace.Explain())
		}
		return took
	}
	publish := func(ids []string, msgs []*natsMsg) {
		if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
			t.Fatalf("publish: %v", err)
		}
		all = append(all, ids...)
	}

	// A: purge RETRIES while every item is pending.
	idsA, msgsA := failedItems(t, kind, "s05a", n, nil)
	startA := time.Now()
	publish(idsA, msgsA)
	pending(idsA, startA)
	if err := stream.Purge(s.Ctx); err != nil {
		t.Fatal(err)
	}
	r.Fault("purge RETRIES with %d retries pending", len(idsA))
	r.Note("after purge: all due in %s", comeDue(idsA).Round(time.Millisecond))

	// B: delete the scheduler's durable consumer, then fail more items.
	if err := s.JS.DeleteConsumer(s.Ctx, contract.StreamRetries, scheduler.ConsumerName); err != nil {
		t.Fatal(err)
	}
	r.Fault("delete durable consumer %q", scheduler.ConsumerName)
	idsB, msgsB := failedItems(t, kind, "s05b", n, nil)
	publish(idsB, msgsB)
	r.Note("after consumer delete: all due in %s", comeDue(idsB).Round(time.Millisecond))

	// C: delete the whole stream while items are pending, and publish
	// more failures while it is gone (the publisher retries until it is
	// back).
	idsC, msgsC := failedItems(t, kind, "s05c", n, nil)
	startC := time.Now()
	publish(idsC, msgsC)
	pending(idsC, startC)
	before, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Due))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.JS.DeleteStream(s.Ctx, contract.StreamRetries); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	r.Fault("delete stream RETRIES with %d retries pending", len(idsC))
	idsD, msgsD := failedItems(t, kind, "s05d", n/5, nil)
	ctx, cancel := context.WithTimeout(s.Ctx, time.Minute)
	defer cancel()
	if _, err := harness.PublishAll(ctx, s.JS, msgsD); err != nil {
		t.Fatalf("publish after stream delete: %v", err)
	}
	all = append(all, idsD...)
	comeDue(append(idsC, idsD...))
	r.Recover = time.Since(deleted)
	// The owners' outcomes close every retry.
	if _, ok := harness.Eventually(s.Ctx, time.Minute, 50*time.Millisecond, func() bool {
		return states(s.Ctx, s.Pool, kind)["succeeded"] == len(all)
	}); !ok {
		t.Errorf("retries not all resolved: rows %v", states(s.Ctx, s.Pool, kind))
	}

	after, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Due))
	if err != nil {
		t.Fatal(err)
	}
	counts := harness.CountByMsgID(append(before, after...))
	r.Sent = len(all)
	for _, id := range all {
		if !owner.Has(id, 2) {
			r.Lost++
		}
	}
	r.DuplicateEffects = harness.Duplicates(counts)
	_, redeliveries := owner.Tally()
	r.Absorbed = redeliveries
	r.Note("rows at the end %v", states(s.Ctx, s.Pool, kind))
	r.Print(t)
	if r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d", r.Lost, r.DuplicateEffects)
	}
}

// decisionRate publishes n first failures of a calibration kind nobody
// owns, with a policy that keeps them pending for an hour, and returns how
// many the scheduler decided per second, publishing included as in the
// scenario.
func decisionRate(t *testing.T, s *harness.System, n int) float64 {
	t.Helper()
	const kind = "ftcal"
	s.Policy(kind, "", fastPolicy("faults-calibrate", time.Hour, 1))
	_, msgs := failedItems(t, kind, "cal", n, nil)
	start := time.Now()
	if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
		t.Fatalf("publish calibration failures: %v", err)
	}
	if _, ok := harness.Eventually(s.Ctx, 5*time.Minute, 10*time.Millisecond, func() bool {
		return states(s.Ctx, s.Pool, kind)["scheduled"] >= n
	}); !ok {
		t.Fatalf("calibration: %d failures not decided in 5 minutes: rows %v", n, states(s.Ctx, s.Pool, kind))
	}
	return float64(n) / time.Since(start).Seconds()
}
