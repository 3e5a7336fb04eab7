package triggers

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

// stopNow stops an instance that "died": its unacked messages go to the
// next instance after AckWait.
func stopNow(t *testing.T, svc *Service) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = svc.Stop(ctx)
}

// A first instance commits every delivery and dies before anything is
// published or acked. A second instance finds the work in its outbox and
// the messages redelivered: every run is requested exactly once and every
// held delivery's failed event is published.
func TestCrashAfterCommitBeforePublish(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	tr := b.createTrigger(t, TriggerInput{ID: "crashy", Name: "crashy", Source: "shop", EventType: "order.placed",
		Throttle: &ThrottleInput{Limit: new(3), Window: "1h"}, Workflow: "fulfil"})

	crashed := b.testConfig(t)
	crashed.noRelay = true
	crashed.failpoint = func(_ context.Context, name string) error {
		if name == "deliver.after-commit" {
			return fmt.Errorf("killed")
		}
		return nil
	}
	first := b.start(t, crashed)
	const events = 5
	for i := range events {
		b.publishEvent(t, "shop", "order.placed", fmt.Sprintf("o%d", i), map[string]any{"i": i})
	}
	require.Eventually(t, func() bool {
		c := b.countDeliveries(t, tr.ID)
		return c[triggerstore.StatusLaunched] == 3 && c[triggerstore.StatusThrottled] == 2
	}, eventually, tick)
	require.Empty(t, b.requestedRuns(t), "nothing was published before the crash")
	require.False(t, b.outboxEmpty(t))
	stopNow(t, first)

	second := b.start(t, b.testConfig(t))
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)
	require.Eventually(t, func() bool {
		return counter(t, first.metrics.duplicates, ConsumerEvents)+counter(t, second.metrics.duplicates, ConsumerEvents) == events
	}, eventually, tick, "every event is redelivered and found applied")
	runs := b.requestedRuns(t)
	require.Len(t, runs, 3)
	for id, n := range runs {
		require.Equal(t, 1, n, id)
	}
	require.Len(t, b.lifecycle(t, contract.Held), 2)
	require.Equal(t, map[triggerstore.Status]int{triggerstore.StatusLaunched: 3, triggerstore.StatusThrottled: 2}, b.countDeliveries(t, tr.ID))
}

// A crash before the commit rolls everything back; the redelivered
// message does the work once.
func TestCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	tr := b.createTrigger(t, TriggerInput{ID: "rollback", Name: "rollback", Source: "shop", EventType: "order.placed",
		MaxConcurrency: new(1), Workflow: "fulfil"})
	var hits atomic.Int32
	cfg := b.testConfig(t)
	cfg.failpoint = func(_ context.Context, name string) error {
		if (name == "deliver.before-commit" || name == "retry.before-commit") && hits.Add(1)%2 == 1 {
			return fmt.Errorf("killed")
		}
		return nil
	}
	svc := b.start(t, cfg)
	id1, id2 := DeliveryID("o1", tr.ID), DeliveryID("o2", tr.ID)
	b.publishEvent(t, "shop", "order.placed", "o1", map[string]any{})
	d1 := b.waitDelivery(t, id1, func(d triggerstore.Delivery) bool { return true })
	require.Equal(t, triggerstore.StatusLaunched, d1.Status)
	b.publishEvent(t, "shop", "order.placed", "o2", map[string]any{})
	b.waitDelivery(t, id2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusConcurrencyLimited })
	f := findHeld(t, b, id2, 1)

	b.publishRunFinished(t, "fulfil", d1.RunID, contract.RunCompleted)
	b.waitSlotsFree(t, tr.ID)
	b.publishDue(t, id2, 2, f.Payload)
	b.waitDelivery(t, id2, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)
	require.Equal(t, map[string]int{RunID(id1): 1, RunID(id2): 1}, b.requestedRuns(t))
	require.GreaterOrEqual(t, hits.Load(), int32(4), "every transaction crashed once before it committed")
	require.Equal(t, 1.0, counter(t, svc.metrics.retrySucceeded, tr.ID))
}

// The service's config is checked, naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := New(Config{})
	require.ErrorContains(t, err, "Config.Pool is required")
	require.ErrorContains(t, err, "Config.JS is required")
	b := setup(t, false)
	cfg := b.testConfig(t)
	cfg.Concurrency, cfg.AckWait = 1000, time.Millisecond
	_, err = New(cfg)
	require.ErrorContains(t, err, "Config.Concurrency")
	require.ErrorContains(t, err, "Config.AckWait")

	cfg = b.testConfig(t)
	svc, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Stop(context.Background()), "stopping a service never started is a no-op")
	require.NoError(t, svc.Start(b.ctx))
	require.Error(t, svc.Start(b.ctx))
	require.NoError(t, svc.Stop(context.Background()))
	require.NoError(t, svc.Stop(context.Background()), "Stop is idempotent")
	cfg.Registerer = prometheus.NewRegistry()
	_, err = New(cfg)
	require.NoError(t, err)
}

// An instance that dies after committing a run's failure, and one that
// dies after committing its relaunch, before anything is published or
// acked: the next instance publishes the retry fact and the new request
// once each, and the redelivered messages change nothing.
func TestCrashOnTheRunRetryPath(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	tr := b.createTrigger(t, TriggerInput{ID: "flaky", Name: "flaky", Source: "shop", EventType: "order.placed", Workflow: "fulfil"})
	crashAt := func(point string, relay bool) *Service {
		cfg := b.testConfig(t)
		cfg.noRelay = !relay
		cfg.failpoint = func(_ context.Context, name string) error {
			if name == point {
				return fmt.Errorf("killed")
			}
			return nil
		}
		return b.start(t, cfg)
	}
	first := crashAt("deliver.never", true)
	b.publishEvent(t, "shop", "order.placed", "o1", map[string]any{})
	d := b.waitDelivery(t, DeliveryID("o1", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	stopNow(t, first)

	second := crashAt(failpointRunFailedCommitted, false)
	fail, err := contract.NewRunMsg("test/engine", contract.RunFailed, contract.RunFinishedData{RunID: d.RunID, Workflow: "fulfil",
		Attempt: 1, Node: "pack", Error: &contract.ErrorInfo{Class: "network", Message: "reset"}}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, fail)
	require.NoError(t, err)
	b.waitRun(t, d.RunID, triggerstore.RunRetrying)
	require.Empty(t, b.lifecycleOf(t, contract.KindRun, contract.Failed), "nothing was published before the crash")
	stopNow(t, second)

	// The relay of this one publishes the failure; it dies after it
	// commits the relaunch, whose request may or may not have gone out.
	third := crashAt(failpointRelaunchCommitted, true)
	f := findLifecycleOf(t, b, contract.KindRun, contract.Failed, d.RunID, 1)
	require.Equal(t, "network", f.Failed.Error.Class)
	require.Eventually(t, func() bool { return counter(t, third.metrics.duplicates, ConsumerRuns) >= 1 }, eventually, tick,
		"the failure is redelivered and found applied")
	due, err := contract.NewLifecycleMsg("test/scheduler", contract.Due, contract.DueData{
		Kind: contract.KindRun, ID: d.RunID, Attempt: 2, NextAttemptAt: time.Now().UTC(), Checkpoint: f.Failed.Checkpoint,
	}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, due)
	require.NoError(t, err)
	b.waitRun(t, d.RunID, triggerstore.RunRequested)
	stopNow(t, third)

	fourth := b.start(t, b.testConfig(t))
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)
	require.Eventually(t, func() bool { return counter(t, fourth.metrics.duplicates, ConsumerRunRetries) >= 1 }, eventually, tick,
		"the due is redelivered and found applied")
	require.Len(t, b.lifecycleOf(t, contract.KindRun, contract.Failed), 1)
	var attempts []int
	for _, m := range b.streamMsgs(t, contract.StreamRuns, "runs.fulfil.requested."+d.RunID) {
		_, req, err := contract.DecodeRunRequested(m.Subject(), m.Data())
		require.NoError(t, err)
		attempts = append(attempts, max(req.Attempt, 1))
	}
	require.Equal(t, []int{1, 2}, attempts, "each attempt requested once")
	require.Equal(t, 2, b.run(t, d.RunID).Attempt)
}

// Predicates stored before the limits of issue 41 (written here straight
// into Postgres, past the API's checks), with their events waiting in
// EVENTS. An instance evaluates them, again on each redelivery, without
// running out of memory; it dies before each commit. The next one, started
// with the events still pending, settles them as evaluation errors: the
// deliveries are filtered, with definition_error for the predicate that no
// longer compiles and predicate_error for one that compiles but reaches the
// run-time limits, and the event's other trigger launches.
func TestPoisonPredicatesSettleAcrossRestarts(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	store := func(id, typ, predicate string) {
		_, err := triggerstore.CreateTrigger(b.ctx, b.pool, id, triggerstore.Definition{
			Name: id, Source: "shop", EventType: typ, Predicate: predicate, Workflow: "fulfil", Enabled: true})
		require.NoError(t, err)
	}
	// Within MaxComprehensionDepth, but a 1 KB string becomes 512 KiB.
	const wide = `[data.s + data.s + data.s + data.s].exists(a, [a + a + a + a].exists(b, [b + b + b + b].exists(c,
		size(c + c + c + c + c + c + c + c) > 0)))`
	store("a-nested", "order.placed", doublingPredicate(18))
	store("b-plain", "order.placed", `data.s != ""`)
	store("a-wide", "order.paid", wide)
	data := map[string]any{"s": strings.Repeat("x", 1000)}
	b.publishEvent(t, "shop", "order.placed", "placed-1", data)
	b.publishEvent(t, "shop", "order.paid", "paid-1", data)

	var evaluated atomic.Int32
	crashed := b.testConfig(t)
	crashed.failpoint = func(_ context.Context, name string) error {
		if name == failpointDeliverBeforeCommit {
			evaluated.Add(1)
			return fmt.Errorf("killed")
		}
		return nil
	}
	first := b.start(t, crashed)
	// Each delivery of an event reaches the failpoint once, at its first
	// trigger (a-nested, a-wide): four hits are two deliveries of each.
	require.Eventually(t, func() bool { return evaluated.Load() >= 4 }, eventually, tick)
	stopNow(t, first)
	require.Empty(t, b.countDeliveries(t, "a-nested"), "nothing committed: the events are still pending")
	require.Empty(t, b.countDeliveries(t, "a-wide"))

	var logs servicetest.Buffer
	cfg := b.testConfig(t)
	cfg.Logger = zerolog.New(&logs)
	second := b.start(t, cfg)
	settled := func(id string) triggerstore.Delivery {
		return b.waitDelivery(t, id, func(triggerstore.Delivery) bool { return true })
	}
	nested := settled(DeliveryID("placed-1", "a-nested"))
	require.Equal(t, triggerstore.StatusFiltered, nested.Status)
	require.Equal(t, ReasonDefinitionError, nested.StatusReason)
	wideD := settled(DeliveryID("paid-1", "a-wide"))
	require.Equal(t, triggerstore.StatusFiltered, wideD.Status)
	require.Equal(t, ReasonPredicateError, wideD.StatusReason)
	plain := settled(DeliveryID("placed-1", "b-plain"))
	require.Equal(t, triggerstore.StatusLaunched, plain.Status)
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)
	require.Equal(t, map[string]int{plain.RunID: 1}, b.requestedRuns(t))
	require.Equal(t, 1.0, counter(t, second.metrics.filtered, "a-nested", ReasonDefinitionError))
	require.Equal(t, 1.0, counter(t, second.metrics.filtered, "a-wide", ReasonPredicateError))
	require.Contains(t, logs.String(), `"limit":"operation cancelled: actual cost limit exceeded","trigger_id":"a-wide"`)
	require.Contains(t, logs.String(), `"error":"predicate nests comprehensions (all, exists, exists_one, map, filter) 18 deep, more than the limit of 3`)
}
