package demo

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// The demo trigger's run timeout, and how the executor keeps its runs
// within it: most runs end well inside it, one in slowRunEvery runs for
// longer than the timeout and lives only because it heartbeats.
const (
	runTimeout        = 5 * time.Second
	heartbeatInterval = time.Second
	slowRunEvery      = 10
	slowRunTime       = 8 * time.Second
)

// startExecutor runs the demo's workflow engine: every run the trigger
// requests takes 0.3 to 2.5 seconds (one in ten takes 8 s, beyond the
// trigger's 5 s run timeout) over its three nodes, reported one by one,
// and then completes, or fails at its second node (see nodeError) and is
// retried from there. A run in flight heartbeats every second, which
// renews its lease on its max-concurrency slot. While runs are in flight
// the trigger's max concurrency holds deliveries back; a finished run
// releases the oldest.
func (d *Demo) startExecutor(ctx context.Context) error {
	cons, err := d.cfg.JS.CreateOrUpdateConsumer(ctx, contract.StreamRuns, jetstream.ConsumerConfig{
		Durable:       ExecutorName,
		Description:   "retryd dev --demo: completes requested runs after a short random time",
		FilterSubject: "runs.*." + contract.RunRequested + ".*",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 64,
		MaxDeliver:    -1,
	})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		_, run, err := contract.DecodeRunRequested(msg.Subject(), msg.Data())
		if err != nil {
			_ = msg.TermWithReason("demo executor: " + err.Error())
			return
		}
		d.wg.Go(func() { d.execute(runCtx, msg, run) })
	})
	if err != nil {
		cancel()
		return err
	}
	// Stopping abandons the runs in flight: unacked, they are delivered
	// again after the next start.
	d.stopExec = func() {
		cc.Stop()
		cancel()
	}
	return nil
}

// demoNodes are the demo workflow's nodes. failingNode fails on a run's
// first attempt one time in failEvery, with a retryable class: the
// scheduler retries the run and it resumes there, with the output of the
// node before it (docs/runs.md). One run in permanentEvery fails with a
// validation error, which is not retried.
var demoNodes = []string{"reserve_stock", "charge_card", "ship"}

const (
	failingNode    = "charge_card"
	failEvery      = 5
	permanentEvery = 40
)

func (d *Demo) execute(ctx context.Context, msg jetstream.Msg, run contract.RunRequestedData) {
	took := time.Duration(300+rand.IntN(2200)) * time.Millisecond
	if rand.IntN(slowRunEvery) == 0 {
		took = slowRunTime
	}
	attempt := max(run.Attempt, 1)
	skip := ""
	if run.ResumeFrom != nil {
		skip = run.ResumeFrom.Node
	}
	end := contract.RunFinishedData{RunID: run.RunID, Workflow: run.Workflow, Attempt: attempt, Executor: ExecutorName}
	for _, node := range demoNodes {
		if skip != "" {
			if node == skip {
				skip = ""
			}
			continue
		}
		if !d.work(ctx, msg, run, took/time.Duration(len(demoNodes))) {
			return
		}
		step := contract.RunStepData{RunID: run.RunID, Workflow: run.Workflow, Attempt: attempt, Node: node,
			Status: contract.StepCompleted, Output: []byte(`{"node":"` + node + `","ok":true}`), Executor: ExecutorName}
		if e := nodeError(node, attempt); e != nil {
			step.Status, step.Output, step.Error = contract.StepFailed, nil, e
			end.Node, end.Error = node, e
		}
		if !d.publish(ctx, msg, contract.RunStep, step) {
			return
		}
		if end.Error != nil {
			break
		}
	}
	event := contract.RunCompleted
	if end.Error != nil {
		event = contract.RunFailed
	}
	if d.publish(ctx, msg, event, end) {
		_ = msg.Ack()
	}
}

// nodeError is the demo's failure, if any, of node at attempt.
func nodeError(node string, attempt int) *contract.ErrorInfo {
	switch {
	case node != failingNode || attempt > 1:
		return nil
	case rand.IntN(permanentEvery) == 0:
		return &contract.ErrorInfo{Class: "validation", Message: "payment: card number rejected"}
	case rand.IntN(failEvery) == 0:
		return &contract.ErrorInfo{Class: "temporary", Message: "payment: gateway returned 503"}
	}
	return nil
}

// publish sends a run message; on failure the request is handed back
// (nak) and the run is tried again from its start.
func (d *Demo) publish(ctx context.Context, msg jetstream.Msg, event string, data interface{ Validate() error }) bool {
	out, err := contract.NewRunMsg(PublisherName, event, data, time.Now())
	if err != nil {
		_ = msg.TermWithReason("demo executor: " + err.Error())
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.cfg.JS.PublishMsg(pctx, out); err != nil {
		_ = msg.Nak()
		return false
	}
	return true
}

// work "runs" the workflow for took, heartbeating the run's lease and
// telling JetStream the request is still in progress. It reports false
// when the executor stopped first.
func (d *Demo) work(ctx context.Context, msg jetstream.Msg, run contract.RunRequestedData, took time.Duration) bool {
	done := time.NewTimer(took)
	defer done.Stop()
	beat := time.NewTicker(heartbeatInterval)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-done.C:
			return true
		case <-beat.C:
			d.heartbeat(ctx, run)
			_ = msg.InProgress()
		}
	}
}

// heartbeat renews the run's lease; a lost heartbeat only shortens the
// lease, the next one renews it.
func (d *Demo) heartbeat(ctx context.Context, run contract.RunRequestedData) {
	hb, err := contract.NewRunMsg(PublisherName, contract.RunHeartbeat,
		contract.RunHeartbeatData{RunID: run.RunID, Workflow: run.Workflow}, time.Now())
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _ = d.cfg.JS.PublishMsg(pctx, hb)
}
