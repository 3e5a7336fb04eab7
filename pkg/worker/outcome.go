package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/owner"
)

// Reserved metadata keys that carried a job's overrides through its
// failure and back on the due event before due events had fields for them.
//
// Deprecated: the worker sends the overrides as fields of the failed and
// held events, and the scheduler gives them back as fields of the due. The
// due router still reads these keys from dues that a scheduler older than
// that emitted; they will go in a later release.
const (
	MetaMaxRetries   = "retryd.max_retries"
	MetaRetryEnabled = "retryd.retry_enabled"
	MetaTimeoutMS    = "retryd.timeout_ms"
)

type outcomeMsg struct {
	msg   *nats.Msg
	event string
	class string
}

// item is the owner runtime's view of a job's attempt: the facts an
// owner reports are built from it.
func item(d contract.JobData, checkpoint json.RawMessage) *owner.Item {
	it := &owner.Item{
		Kind: contract.KindJob, ID: d.ID, Attempt: d.Attempt,
		Payload: d.Payload, Checkpoint: checkpoint, Metadata: d.Metadata,
		JobType: d.JobType, MaxRetries: d.MaxRetries, RetryEnabled: d.RetryEnabled,
		TimeoutMS: d.TimeoutMS, Priority: d.Priority,
	}
	it.StartedFrom(d.Checkpoint)
	return it
}

func (w *Worker) succeededMsg(d contract.JobData) (*outcomeMsg, error) {
	msg, err := w.facts.Succeeded(item(d, nil))
	if err != nil {
		return nil, err
	}
	return &outcomeMsg{msg: msg, event: string(contract.Succeeded)}, nil
}

// classify maps a handler's error to what the failed event reports: a
// timeout or a panic as the worker saw it, anything else as every owner
// classifies it.
func (w *Worker) classify(res attemptResult) owner.Failure {
	var p *panicError
	switch {
	case res.outcome == outcomeTimedOut:
		return owner.Failure{Class: errclass.Timeout, Message: fmt.Sprintf("attempt timed out after %s: %v", res.timeout, res.err)}
	case errors.As(res.err, &p):
		return owner.Failure{Class: errclass.Temporary, Message: p.Error()}
	}
	return owner.Classify(res.err, w.cfg.Classifier)
}

func (w *Worker) failedMsg(d contract.JobData, checkpoint json.RawMessage, res attemptResult) (*outcomeMsg, error) {
	f := w.classify(res)
	msg, err := w.facts.Failed(item(d, checkpoint), f)
	if err != nil {
		return nil, err
	}
	return &outcomeMsg{msg: msg, event: string(contract.Failed), class: string(f.Class)}, nil
}

func (w *Worker) heldMsg(d contract.JobData, checkpoint json.RawMessage, h *HoldError) (*outcomeMsg, error) {
	msg, err := w.facts.Held(item(d, checkpoint), h)
	if err != nil {
		return nil, err
	}
	return &outcomeMsg{msg: msg, event: string(contract.Held), class: h.HoldReason()}, nil
}

// restoreOverrides moves the reserved metadata keys of a due event that
// an older scheduler emitted back into the job's fields, where the due did
// not set them. Values that do not parse are dropped.
func restoreOverrides(d *contract.JobData) {
	if len(d.Metadata) == 0 {
		return
	}
	md := make(map[string]string, len(d.Metadata))
	for k, v := range d.Metadata {
		switch k {
		case MetaMaxRetries:
			if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= 1000 && d.MaxRetries == nil {
				d.MaxRetries = &n
			}
		case MetaRetryEnabled:
			if b, err := strconv.ParseBool(v); err == nil && d.RetryEnabled == nil {
				d.RetryEnabled = &b
			}
		case MetaTimeoutMS:
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n <= contract.MaxTimeoutMS && d.TimeoutMS == 0 {
				d.TimeoutMS = n
			}
		default:
			md[k] = v
		}
	}
	if len(md) == 0 {
		md = nil
	}
	d.Metadata = md
}

// publish sends msg and waits for the stream's ack, trying again on
// errors; it gives up when the worker is forced to stop.
func (w *Worker) publish(msg *nats.Msg, event string) (*jetstream.PubAck, error) {
	return w.reporter.Publish(w.hardCtx, msg, event)
}

// publishOutcome publishes out for the attempt of data. A failed or held
// fact is kept until the scheduler's decision is seen (owner.Reporter).
func (w *Worker) publishOutcome(data contract.JobData, out *outcomeMsg) error {
	_, err := w.reporter.Report(w.hardCtx, data.ID, data.Attempt, contract.Lifecycle(out.event), out.msg)
	return err
}
