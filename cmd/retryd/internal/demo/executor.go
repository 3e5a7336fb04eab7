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
// trigger's 5 s run timeout) and then completes, or, one time in twenty,
// fails. A run in flight heartbeats every second, which renews its lease
// on its max-concurrency slot. While runs are in flight the trigger's max
// concurrency holds deliveries back; a finished run releases the oldest.
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

func (d *Demo) execute(ctx context.Context, msg jetstream.Msg, run contract.RunRequestedData) {
	took := time.Duration(300+rand.IntN(2200)) * time.Millisecond
	if rand.IntN(slowRunEvery) == 0 {
		took = slowRunTime
	}
	if !d.work(ctx, msg, run, took) {
		return
	}
	event, data := contract.RunCompleted, contract.RunFinishedData{RunID: run.RunID, Workflow: run.Workflow}
	if rand.IntN(20) == 0 {
		event = contract.RunFailed
		data.Error = &contract.ErrorInfo{Class: "temporary", Message: "fulfilment: warehouse API returned 503"}
	}
	out, err := contract.NewRunMsg(PublisherName, event, data, time.Now())
	if err != nil {
		_ = msg.TermWithReason("demo executor: " + err.Error())
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.cfg.JS.PublishMsg(pctx, out); err != nil {
		_ = msg.Nak()
		return
	}
	_ = msg.Ack()
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
