package demo

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// startExecutor runs the demo's workflow engine: every run the trigger
// requests takes 0.3 to 2.5 seconds and then completes (or, one time in
// twenty, fails). While runs are in flight the trigger's max concurrency
// holds deliveries back, which the scheduler retries.
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
	t := time.NewTimer(time.Duration(300+rand.IntN(2200)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
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
