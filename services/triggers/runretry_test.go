package triggers

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

// nodeRun is one execution of a node by the scripted engine.
type nodeRun struct {
	Attempt int
	Input   string
}

// scriptedEngine runs a three-node workflow (fetch, enrich, notify) for
// each run request, as docs/runs.md tells an engine to: it skips the nodes
// up to resume_from, reports each node and echoes the attempt. fail says
// whether a node fails at an attempt, and with which class.
type scriptedEngine struct {
	mu       sync.Mutex
	ran      map[string][]nodeRun // by run id + "/" + node
	requests map[string]int       // by run id + attempt
}

var workflowNodes = []string{"fetch", "enrich", "notify"}

func (b *bundle) startScriptedEngine(t *testing.T, durable string, fail func(runID, node string, attempt int) string) *scriptedEngine {
	t.Helper()
	e := &scriptedEngine{ran: map[string][]nodeRun{}, requests: map[string]int{}}
	cons, err := b.js.CreateOrUpdateConsumer(b.ctx, contract.StreamRuns, jetstream.ConsumerConfig{
		Durable: durable, FilterSubjects: []string{"runs.*.requested.*"},
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second,
	})
	require.NoError(t, err)
	publish := func(event string, data interface{ Validate() error }) {
		msg, err := contract.NewRunMsg("test/engine", event, data, time.Now())
		if err == nil {
			_, err = b.js.PublishMsg(context.Background(), msg)
		}
		if err != nil && b.ctx.Err() == nil {
			t.Errorf("engine: publish %s: %v", event, err)
		}
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		defer func() { _ = m.Ack() }()
		_, d, err := contract.DecodeRunRequested(m.Subject(), m.Data())
		if err != nil {
			t.Errorf("engine: %v", err)
			return
		}
		attempt := max(d.Attempt, 1)
		e.mu.Lock()
		e.requests[d.RunID+"/"+strconv.Itoa(attempt)]++
		e.mu.Unlock()
		outputs := map[string]json.RawMessage{}
		skip := -1
		if d.ResumeFrom != nil {
			outputs = d.ResumeFrom.Outputs
			for i, n := range workflowNodes {
				if n == d.ResumeFrom.Node {
					skip = i
				}
			}
		}
		input := string(d.Event)
		if skip >= 0 {
			input = string(outputs[workflowNodes[skip]])
		}
		for i, node := range workflowNodes {
			if i <= skip {
				continue
			}
			e.mu.Lock()
			e.ran[d.RunID+"/"+node] = append(e.ran[d.RunID+"/"+node], nodeRun{Attempt: attempt, Input: input})
			e.mu.Unlock()
			step := contract.RunStepData{RunID: d.RunID, Workflow: d.Workflow, Attempt: attempt, Node: node, Executor: "engine-1"}
			if class := fail(d.RunID, node, attempt); class != "" {
				step.Status, step.Error = contract.StepFailed, &contract.ErrorInfo{Class: class, Message: node + " failed"}
				publish(contract.RunStep, step)
				publish(contract.RunFailed, contract.RunFinishedData{RunID: d.RunID, Workflow: d.Workflow, Attempt: attempt,
					Node: node, Executor: "engine-1", Error: step.Error})
				return
			}
			out, _ := json.Marshal(map[string]string{"node": node, "run": d.RunID})
			step.Status, step.Output = contract.StepCompleted, out
			publish(contract.RunStep, step)
			input = string(out)
		}
		publish(contract.RunCompleted, contract.RunFinishedData{RunID: d.RunID, Workflow: d.Workflow, Attempt: attempt, Executor: "engine-1"})
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	return e
}

func (e *scriptedEngine) runs(runID, node string) []nodeRun {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]nodeRun(nil), e.ran[runID+"/"+node]...)
}

func (e *scriptedEngine) requested(runID string, attempt int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.requests[runID+"/"+strconv.Itoa(attempt)]
}

// fastRunRetries makes the run policy's backoff short and exact.
func (b *bundle) fastRunRetries(t *testing.T, base time.Duration) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE retry_policies SET base_delay_ms = $1, max_delay_ms = $1, jitter = 'none', jitter_ms = 0,
		version = version + 1 WHERE kind = 'run' AND job_type = ''`, base.Milliseconds())
	require.NoError(t, err)
}

func (b *bundle) waitRun(t *testing.T, id string, status triggerstore.RunStatus) triggerstore.Run {
	t.Helper()
	var r triggerstore.Run
	require.Eventually(t, func() bool {
		var err error
		r, err = triggerstore.GetRun(b.ctx, b.pool, id)
		return err == nil && r.Status == status
	}, eventually, tick, "run %s never %s (last %s)", id, status, r.Status)
	return r
}

// Seed 003: a run that fails at its second node with a retryable class is
// retried by the scheduler and resumes at that node with the first node's
// output, until it completes. Every failure and every due arrives twice.
func TestRunRetriesResumeFromTheFailedNode(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	sched := b.startScheduler(t)
	b.fastRunRetries(t, 50*time.Millisecond)
	failures := b.duplicate(t, "runs.*.failed.*")
	dues := b.duplicate(t, "retry.run.due.*")
	e := b.startScriptedEngine(t, "engine", func(_, node string, attempt int) string {
		if node == "enrich" && attempt <= 2 {
			return "network"
		}
		return ""
	})
	tr := b.createTrigger(t, TriggerInput{ID: "onboard", Name: "onboard", Source: "crm", EventType: "lead.created", Workflow: "onboard"})
	b.publishEvent(t, "crm", "lead.created", "lead-1", map[string]any{"name": "Ada"})
	d := b.waitDelivery(t, DeliveryID("lead-1", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })

	r := b.waitRun(t, d.RunID, triggerstore.RunCompleted)
	require.Equal(t, 3, r.Attempt)
	require.Equal(t, 2, r.RetryCount)
	require.NotNil(t, r.MaxRetries)
	require.Equal(t, 3, *r.MaxRetries)
	require.Equal(t, "network", r.LastErrorClass)
	require.Equal(t, "engine-1", r.Executor)
	require.NotNil(t, r.FinishedAt)

	fetch, enrich, notify := e.runs(d.RunID, "fetch"), e.runs(d.RunID, "enrich"), e.runs(d.RunID, "notify")
	require.Len(t, fetch, 1, "node 1 ran once")
	require.Len(t, enrich, 3, "node 2 ran three times")
	for i, nr := range enrich {
		require.Equal(t, i+1, nr.Attempt)
		require.JSONEq(t, `{"node":"fetch","run":"`+d.RunID+`"}`, nr.Input, "with node 1's output")
	}
	require.Len(t, notify, 1, "node 3 ran once")
	for attempt := 1; attempt <= 3; attempt++ {
		require.Equal(t, 1, e.requested(d.RunID, attempt), "attempt %d requested once", attempt)
	}

	// Reports are applied concurrently: the run's end can come before
	// its last steps.
	var steps []triggerstore.Step
	require.Eventually(t, func() bool {
		var err error
		steps, err = triggerstore.Steps(b.ctx, b.pool, d.RunID)
		require.NoError(t, err)
		if len(steps) != 3 {
			return false
		}
		for _, s := range steps {
			if s.Status != contract.StepCompleted {
				return false
			}
		}
		return true
	}, eventually, tick)
	for i, want := range []struct {
		node, state       string
		attempts, retries int
	}{{"fetch", "none", 1, 0}, {"enrich", "succeeded", 3, 2}, {"notify", "none", 1, 0}} {
		s := steps[i]
		require.Equal(t, want.node, s.Node)
		require.Equal(t, contract.StepCompleted, s.Status, s.Node)
		require.Equal(t, want.state, s.RetryState, s.Node)
		require.Equal(t, want.attempts, s.Attempts, s.Node)
		require.Equal(t, want.retries, s.RetryAttempts, s.Node)
		require.Equal(t, "engine-1", s.Executor)
	}
	require.Equal(t, "network", steps[1].LastErrorClass)
	require.Equal(t, "notify", b.run(t, d.RunID).CurrentNodeID, "the last node reported, even after the run's end")

	// The scheduler's record: two failures, two retries, closed by the
	// run's success.
	var state string
	require.Eventually(t, func() bool {
		return b.pool.QueryRow(b.ctx, `SELECT state FROM retries WHERE kind = 'run' AND item_id = $1`, d.RunID).Scan(&state) == nil &&
			state == "succeeded"
	}, eventually, tick)
	require.GreaterOrEqual(t, failures.Load(), int64(2))
	require.GreaterOrEqual(t, dues.Load(), int64(2))
	require.Equal(t, 2.0, counter(t, b.svc.metrics.runsRetried, tr.ID))
	require.Equal(t, 1.0, counter(t, b.svc.metrics.runsFinished, tr.ID, "completed"))

	// An operator's retry of the completed run runs nothing, and the
	// scheduler's retry is closed again instead of staying due.
	_, err := sched.RetryNow(b.ctx, contract.KindRun, d.RunID, scheduler.RetryNowOptions{By: "alice", Reason: "check"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var attempt int
		return b.pool.QueryRow(b.ctx, `SELECT state, attempt FROM retries WHERE kind = 'run' AND item_id = $1`, d.RunID).Scan(&state, &attempt) == nil &&
			state == "succeeded" && attempt == 4
	}, eventually, tick)
	require.Zero(t, e.requested(d.RunID, 4))
	require.Equal(t, triggerstore.RunCompleted, b.run(t, d.RunID).Status)
}

// A failure of a class the policy does not retry ends the run at once:
// failed, never requested again, its slot free.
func TestNonRetryableRunFailsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.startScheduler(t)
	b.fastRunRetries(t, 50*time.Millisecond)
	e := b.startScriptedEngine(t, "engine", func(_, node string, _ int) string {
		if node == "fetch" {
			return "validation"
		}
		return ""
	})
	tr := b.createTrigger(t, TriggerInput{ID: "strict", Name: "strict", Source: "crm", EventType: "lead.created",
		Workflow: "strict", MaxConcurrency: new(1)})
	b.publishEvent(t, "crm", "lead.created", "bad-1", map[string]any{})
	d := b.waitDelivery(t, DeliveryID("bad-1", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	r := b.waitRun(t, d.RunID, triggerstore.RunFailed)
	require.Equal(t, 1, r.Attempt)
	require.Equal(t, 0, r.RetryCount)
	require.Equal(t, "validation", r.LastErrorClass)
	require.Contains(t, r.Error, contract.ExhaustedNonRetryable)
	require.Len(t, e.runs(d.RunID, "fetch"), 1)
	require.Zero(t, e.requested(d.RunID, 2))
	require.Zero(t, b.inFlight(t, tr.ID))
	steps, err := triggerstore.Steps(b.ctx, b.pool, d.RunID)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, "exhausted", steps[0].RetryState)
}

// A retrying run keeps its trigger's concurrency slot: with max
// concurrency 1, a delivery that arrives while the run waits for its retry
// waits for the run to end, and launches after it.
func TestRetryingRunKeepsItsConcurrencySlot(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.startScheduler(t)
	b.fastRunRetries(t, 500*time.Millisecond)
	e := b.startScriptedEngine(t, "engine", func(_, node string, attempt int) string {
		if node == "notify" && attempt == 1 {
			return "temporary"
		}
		return ""
	})
	tr := b.createTrigger(t, TriggerInput{ID: "one", Name: "one", Source: "crm", EventType: "lead.created",
		Workflow: "one", MaxConcurrency: new(1)})
	b.publishEvent(t, "crm", "lead.created", "a", map[string]any{})
	da := b.waitDelivery(t, DeliveryID("a", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	b.waitRun(t, da.RunID, triggerstore.RunRetrying)

	b.publishEvent(t, "crm", "lead.created", "b", map[string]any{})
	b.waitDelivery(t, DeliveryID("b", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusConcurrencyLimited })
	ra := b.waitRun(t, da.RunID, triggerstore.RunCompleted)
	require.Equal(t, 2, ra.Attempt)
	require.Len(t, e.runs(da.RunID, "fetch"), 1)
	require.Len(t, e.runs(da.RunID, "notify"), 2)

	db := b.waitDelivery(t, DeliveryID("b", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	rb := b.waitRun(t, db.RunID, triggerstore.RunCompleted)
	require.False(t, rb.RequestedAt.Before(*ra.FinishedAt), "the second run started after the first ended, retry included")
}

// Malformed step reports are terminated and counted, never applied.
func TestMalformedRunStepIsRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	for _, body := range []string{`{}`, `not json`, `{"specversion":"1.0","id":"x","source":"s","type":"run.step","data":{"run_id":"r","workflow":"w","node":"n","status":"weird"}}`} {
		_, err := b.js.Publish(b.ctx, "runs.w.step.r", []byte(body))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.malformed, ConsumerRuns) >= 3 }, eventually, tick)
}

// A run's failure lost with RETRIES before the scheduler read it is
// published again once ReconcileAfter has passed without an answer, and
// not once the scheduler answered: the run would otherwise hold its slot
// for good.
func TestReconcileRepublishesUnansweredRunFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.ReconcileAfter = 2 * time.Second })
	tr := b.createTrigger(t, TriggerInput{ID: "lost", Name: "lost", Source: "crm", EventType: "lead.created", Workflow: "lost", MaxConcurrency: new(1)})
	b.publishEvent(t, "crm", "lead.created", "l-1", map[string]any{})
	d := b.waitDelivery(t, DeliveryID("l-1", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	fail, err := contract.NewRunMsg("test/engine", contract.RunFailed, contract.RunFinishedData{RunID: d.RunID, Workflow: "lost",
		Attempt: 1, Error: &contract.ErrorInfo{Class: "network", Message: "reset"}}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, fail)
	require.NoError(t, err)
	b.waitRun(t, d.RunID, triggerstore.RunRetrying)
	findLifecycleOf(t, b, contract.KindRun, contract.Failed, d.RunID, 1)
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)

	b.loseRetries(t)
	f := findLifecycleOf(t, b, contract.KindRun, contract.Failed, d.RunID, 1)
	require.Equal(t, "network", f.Failed.Error.Class)
	n, err := b.svc.Reconcile(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a republished failure waits ReconcileAfter again")

	publishLifecycle(t, b, contract.Scheduled, contract.ScheduledData{Kind: contract.KindRun, ID: d.RunID, Attempt: 2,
		NextAttemptAt: time.Now().Add(time.Hour), Decision: contract.Decision{Policy: "workflow_run", MaxRetries: 3, RetryCount: 1}})
	require.Eventually(t, func() bool { return b.run(t, d.RunID).NextRetryAt != nil }, eventually, tick)
	_, err = b.pool.Exec(b.ctx, `UPDATE workflow_runs SET updated_at = updated_at - interval '1 hour' WHERE run_id = $1`, d.RunID)
	require.NoError(t, err)
	n, err = b.svc.Reconcile(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "an answered failure is not published again")
}

// An operator's cancel of a run's retries that arrives while an attempt
// runs stops no work, but makes that attempt the last: when it fails the
// run ends failed and frees its slot, with no retry asked of a scheduler
// that would not answer. A cancel of a retrying run ends it at once.
func TestCancelOfARunsRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	tr := b.createTrigger(t, TriggerInput{ID: "stop", Name: "stop", Source: "crm", EventType: "lead.created", Workflow: "stop", MaxConcurrency: new(2)})
	runs := map[string]string{}
	for _, ev := range []string{"in-flight", "waiting"} {
		b.publishEvent(t, "crm", "lead.created", ev, map[string]any{})
		runs[ev] = b.waitDelivery(t, DeliveryID(ev, tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched }).RunID
	}
	fail := func(runID string) {
		t.Helper()
		msg, err := contract.NewRunMsg("test/engine", contract.RunFailed, contract.RunFinishedData{RunID: runID, Workflow: "stop",
			Attempt: 1, Error: &contract.ErrorInfo{Class: "network", Message: "reset"}}, time.Now())
		require.NoError(t, err)
		_, err = b.js.PublishMsg(b.ctx, msg)
		require.NoError(t, err)
	}
	cancel := func(runID string) {
		publishLifecycle(t, b, contract.Cancelled, contract.CancelledData{Kind: contract.KindRun, ID: runID, Attempt: 1, By: "alice"})
	}

	fail(runs["waiting"])
	b.waitRun(t, runs["waiting"], triggerstore.RunRetrying)
	cancel(runs["waiting"])
	r := b.waitRun(t, runs["waiting"], triggerstore.RunFailed)
	require.Equal(t, "cancelled by alice", r.Error)

	cancel(runs["in-flight"])
	require.Eventually(t, func() bool { return !b.run(t, runs["in-flight"]).RetryEnabled }, eventually, tick)
	require.Equal(t, triggerstore.RunRequested, b.run(t, runs["in-flight"]).Status, "the attempt goes on")
	fail(runs["in-flight"])
	r = b.waitRun(t, runs["in-flight"], triggerstore.RunFailed)
	require.Equal(t, "network", r.LastErrorClass)
	require.NotNil(t, r.FinishedAt)
	require.Zero(t, b.inFlight(t, tr.ID))
	require.Eventually(t, func() bool { return b.outboxEmpty(t) }, eventually, tick)
	for _, f := range b.lifecycleOf(t, contract.KindRun, contract.Failed) {
		require.NotEqual(t, runs["in-flight"], f.ID, "no retry is asked for the last attempt")
	}
}
