package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/contract"
)

// Source is the CloudEvents source of what the engine publishes on RUNS.
const Source = "retryd/example-workflow"

// errAbandoned marks a run left unacknowledged because the engine stops.
var errAbandoned = errors.New("run abandoned: engine stopping")

// handle runs one request and acknowledges it once its end is published.
// A request that does not decode can never run: it is terminated, so RUNS
// does not redeliver it, and counted.
func (e *Engine) handle(ctx context.Context, msg jetstream.Msg) {
	_, req, err := contract.DecodeRunRequested(msg.Subject(), msg.Data())
	if err != nil {
		e.malformed.Add(1)
		e.log.Error().Err(err).Str("subject", msg.Subject()).Msg("malformed run request; terminated")
		if err := msg.TermWithReason("malformed run request"); err != nil {
			e.log.Warn().Err(err).Msg("terminate malformed run request")
		}
		return
	}
	attempt := max(req.Attempt, 1)
	log := e.log.With().Str("run_id", req.RunID).Int("attempt", attempt).Logger()
	runCtx, cancel := context.WithCancel(ctx)
	beating := e.heartbeat(runCtx, msg, req, log)
	err = e.execute(runCtx, req, attempt, log)
	cancel()
	<-beating
	switch {
	case err == nil:
		if err := msg.DoubleAck(context.WithoutCancel(ctx)); err != nil {
			// The end is published; a redelivery finds it in the state
			// bucket and publishes it again under the same id.
			log.Warn().Err(err).Msg("ack run request")
		}
	case ctx.Err() != nil:
		log.Info().Msg("engine stopping; run left unacknowledged for redelivery")
	default:
		log.Error().Err(err).Msg("run interrupted; retrying after a delay")
		_ = msg.NakWithDelay(e.cfg.FetchWait)
	}
}

// heartbeat renews the run's lease on RUNS and its message's ack timer
// every Heartbeat until ctx ends; the returned channel closes when it has
// stopped.
func (e *Engine) heartbeat(ctx context.Context, msg jetstream.Msg, req contract.RunRequestedData, log zerolog.Logger) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(e.cfg.Heartbeat)
		defer t.Stop()
		for {
			if err := msg.InProgress(); err != nil {
				log.Warn().Err(err).Msg("report progress")
			}
			hb, err := contract.NewRunMsg(Source, contract.RunHeartbeat, contract.RunHeartbeatData{RunID: req.RunID, Workflow: req.Workflow}, time.Now())
			if err == nil {
				_, err = e.cfg.JS.PublishMsg(ctx, hb)
			}
			if err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("publish heartbeat")
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return done
}

// ended is what the state bucket keeps of an attempt's end.
type ended struct {
	Event string                   `json:"event"`
	Data  contract.RunFinishedData `json:"data"`
}

// execute runs the attempt's nodes from its resume point and publishes
// its end. An error means the end was not published: the request must be
// delivered again.
func (e *Engine) execute(ctx context.Context, req contract.RunRequestedData, attempt int, log zerolog.Logger) error {
	raw, ok, err := e.lookup(ctx, endKey(req.RunID, attempt))
	if err != nil {
		return err
	}
	if ok {
		// The attempt ended before (its request came back after a crash
		// before the ack): its end is published again under its own id.
		var end ended
		if err := json.Unmarshal(raw, &end); err != nil {
			return fmt.Errorf("decode end of attempt %d: %w", attempt, err)
		}
		e.replayed.Add(1)
		log.Info().Str("event", end.Event).Msg("attempt already ended; its end published again")
		return e.publishEnd(ctx, end)
	}
	start, input, failure := resumePoint(req)
	if failure != nil {
		return e.end(ctx, req, attempt, contract.RunFailed, "", failure, log)
	}
	for _, n := range nodes[start:] {
		out, failure, err := e.runNode(ctx, req, attempt, n, input, log)
		if err != nil {
			return err
		}
		if failure != nil {
			return e.end(ctx, req, attempt, contract.RunFailed, n.name, failure, log)
		}
		input = out
	}
	return e.end(ctx, req, attempt, contract.RunCompleted, "", nil, log)
}

// resumePoint is where an attempt starts: the first node and the event,
// or the node after resume_from.node with that node's output.
func resumePoint(req contract.RunRequestedData) (int, json.RawMessage, *contract.ErrorInfo) {
	rf := req.ResumeFrom
	if rf == nil {
		return 0, req.Event, nil
	}
	i := nodeIndex(rf.Node)
	if i < 0 {
		return 0, nil, &contract.ErrorInfo{Class: "validation", NonRetryable: true,
			Message: fmt.Sprintf("resume_from.node %q is not a node of the workflow", rf.Node)}
	}
	out, ok := rf.Outputs[rf.Node]
	if !ok {
		return 0, nil, &contract.ErrorInfo{Class: "validation", NonRetryable: true,
			Message: fmt.Sprintf("resume_from.outputs has no output for node %q", rf.Node)}
	}
	return i + 1, out, nil
}

// runNode runs one node of the attempt: reported completed with its
// output, or failed with the returned failure. A node this attempt
// already finished (before a crash) is not run again: its output is read
// from the state bucket.
func (e *Engine) runNode(ctx context.Context, req contract.RunRequestedData, attempt int, n node, input json.RawMessage, log zerolog.Logger) (json.RawMessage, *contract.ErrorInfo, error) {
	log = log.With().Str("node", n.name).Logger()
	done := doneKey(req.RunID, attempt, n.name)
	out, ok, err := e.lookup(ctx, done)
	if err != nil || ok {
		if ok {
			log.Info().Msg("node finished before a restart; skipped")
		}
		return out, nil, err
	}
	execution, err := e.nextExecution(ctx, req.RunID, n.name)
	if err != nil {
		return nil, nil, err
	}
	if err := e.recordExecution(ctx, Execution{RunID: req.RunID, Node: n.name, Attempt: attempt, Execution: execution, Input: input, Executor: e.cfg.Executor}); err != nil {
		return nil, nil, err
	}
	step := contract.RunStepData{RunID: req.RunID, Workflow: req.Workflow, Attempt: attempt, Node: n.name, Executor: e.cfg.Executor}
	out, failure := n.run(req.RunID, input, execution, e.cfg.FailFirst)
	if failure != nil {
		step.Status, step.Error = contract.StepFailed, failure
		log.Info().Int("execution", execution).Str("class", failure.Class).Msg("node failed")
		return nil, failure, e.publishRun(ctx, contract.RunStep, step)
	}
	applied, err := e.applyEffect(ctx, Effect{RunID: req.RunID, Node: n.name, Attempt: attempt, Output: out, Executor: e.cfg.Executor})
	if err != nil {
		return nil, nil, err
	}
	if n.name == e.cfg.SlowNode {
		log.Info().Dur("for", e.cfg.SlowFor).Msg("slow node: waiting after its effect")
		select {
		case <-ctx.Done():
			return nil, nil, errAbandoned
		case <-time.After(e.cfg.SlowFor):
		}
	}
	step.Status, step.Output = contract.StepCompleted, out
	if err := e.publishRun(ctx, contract.RunStep, step); err != nil {
		return nil, nil, err
	}
	log.Info().Int("execution", execution).Bool("effect_applied", applied).Msg("node completed")
	return out, nil, e.remember(ctx, done, out)
}

// end records the attempt's end in the state bucket, then publishes it:
// a crash in between finds the record and publishes it on redelivery,
// rather than executing the failed node once more.
func (e *Engine) end(ctx context.Context, req contract.RunRequestedData, attempt int, event, node string, failure *contract.ErrorInfo, log zerolog.Logger) error {
	end := ended{Event: event, Data: contract.RunFinishedData{
		RunID: req.RunID, Workflow: req.Workflow, Error: failure, Attempt: attempt, Node: node, Executor: e.cfg.Executor,
	}}
	raw, err := json.Marshal(end)
	if err != nil {
		return fmt.Errorf("marshal end: %w", err)
	}
	if err := e.remember(ctx, endKey(req.RunID, attempt), raw); err != nil {
		return err
	}
	if err := e.publishEnd(ctx, end); err != nil {
		return err
	}
	if event == contract.RunCompleted {
		e.completed.Add(1)
	} else {
		e.failed.Add(1)
	}
	log.Info().Str("event", event).Str("failed_node", node).Msg("run attempt ended")
	return nil
}

func (e *Engine) publishEnd(ctx context.Context, end ended) error {
	return e.publishRun(ctx, end.Event, end.Data)
}

// publishRun publishes a RUNS message; its Nats-Msg-Id (contract) makes a
// copy published again after a restart a duplicate the stream drops.
func (e *Engine) publishRun(ctx context.Context, event string, data interface{ Validate() error }) error {
	msg, err := contract.NewRunMsg(Source, event, data, time.Now())
	if err != nil {
		return fmt.Errorf("build run %s: %w", event, err)
	}
	if _, err := e.cfg.JS.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish run %s: %w", event, err)
	}
	return nil
}
