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
	delay := time.Duration(harness.Size(6, 30)) * time.Second
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "05 purge RETRIES, delete consumer, delete stream"}
	s.Start(harness.Scheduler)
	s.Policy(kind, "", fastPolicy("faults-05", delay, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()
	stream, err := s.JS.Stream(s.Ctx, contract.StreamRetries)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	pending := func(ids []string) {
		t.Helper()
		if _, ok := harness.Eventually(s.Ctx, 2*time.Minute, 10*time.Millisecond, func() bool {
			return states(s.Ctx, s.Pool, kind)["scheduled"] >= len(ids)
		}); !ok {
			t.Fatalf("items not pending: rows %v", states(s.Ctx, s.Pool, kind))
		}
	}
	comeDue := func(ids []string) time.Duration {
		t.Helper()
		took, ok := harness.Eventually(s.Ctx, delay+2*time.Minute, 20*time.Millisecond, func() bool {
			for _, id := range ids {
				if !owner.Has(id, 2) {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Errorf("not every pending retry came due; rows %v", states(s.Ctx, s.Pool, kind))
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
	publish(idsA, msgsA)
	pending(idsA)
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
	publish(idsC, msgsC)
	pending(idsC)
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
