package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
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

// Publish retries: a failed publish is tried publishAttempts times with
// doubling pauses before the job is handed back to the broker.
const (
	publishAttempts = 5
	publishTimeout  = 5 * time.Second
	publishPause    = 100 * time.Millisecond
)

type outcomeMsg struct {
	msg   *nats.Msg
	event string
	class string
}

func (w *Worker) succeededMsg(d contract.JobData) (*outcomeMsg, error) {
	msg, err := contract.NewLifecycleMsg(w.cfg.Source, contract.Succeeded, contract.SucceededData{
		Kind:     contract.KindJob,
		ID:       d.ID,
		Attempt:  d.Attempt,
		Metadata: d.Metadata,
		Executor: w.cfg.ExecutorID,
	}, w.cfg.Now())
	if err != nil {
		return nil, err
	}
	return &outcomeMsg{msg: msg, event: string(contract.Succeeded)}, nil
}

// failure is a classified handler error.
type failure struct {
	class        errclass.Class
	message      string
	retryAfter   *contract.RetryAfter
	nonRetryable bool
}

// classify maps a handler's error to what the failed event reports.
func (w *Worker) classify(res attemptResult) failure {
	err := res.err
	var p *panicError
	switch {
	case res.outcome == outcomeTimedOut:
		return failure{class: errclass.Timeout, message: fmt.Sprintf("attempt timed out after %s: %v", res.timeout, err)}
	case errors.As(err, &p):
		return failure{class: errclass.Temporary, message: p.Error()}
	}
	if h, ok := AsHold(err); ok {
		// A valid hold never gets here: this one was built by hand with
		// values the scheduler cannot honour. Like a panic, it is a bug
		// in the handler: report it as a temporary failure that says so.
		if verr := h.validate(); verr != nil {
			return failure{class: errclass.Temporary, message: fmt.Errorf("hold job: %w", verr).Error()}
		}
	}
	f := failure{message: err.Error()}
	if e, ok := errclass.As(err); ok {
		f.class = e.Class
		f.nonRetryable = e.NonRetryable
		if e.RetryAfter > 0 {
			f.retryAfter = contract.RetryAfterDuration(e.RetryAfter)
		}
	}
	if f.class == "" {
		class, hint := w.cfg.Classifier.Classify(err)
		f.class = class
		if f.retryAfter == nil && hint > 0 {
			f.retryAfter = contract.RetryAfterDuration(hint)
		}
	}
	if f.class == "" {
		f.class = errclass.Unknown
	}
	return f
}

func (w *Worker) failedMsg(d contract.JobData, checkpoint json.RawMessage, res attemptResult, log *slog.Logger) (*outcomeMsg, error) {
	f := w.classify(res)
	fd := contract.FailedData{
		Kind:         contract.KindJob,
		ID:           d.ID,
		Attempt:      d.Attempt,
		Error:        contract.ErrorInfo{Class: string(f.class), Message: reportable(f.message), NonRetryable: f.nonRetryable},
		RetryAfter:   f.retryAfter,
		JobType:      d.JobType,
		MaxRetries:   d.MaxRetries,
		RetryEnabled: d.RetryEnabled,
		TimeoutMS:    d.TimeoutMS,
		Priority:     d.Priority,
		Payload:      d.Payload,
		Checkpoint:   checkpoint,
		Metadata:     d.Metadata,
		Executor:     w.cfg.ExecutorID,
	}
	msg, err := contract.NewLifecycleMsg(w.cfg.Source, contract.Failed, fd, w.cfg.Now())
	if errors.Is(err, contract.ErrTooLarge) && len(checkpoint) > 0 {
		// Payload and a large new checkpoint do not fit one message: keep
		// the checkpoint the attempt started from, which did fit.
		log.Warn("checkpoint too large to report with the payload; keeping the previous one", slog.Int("checkpoint_bytes", len(checkpoint)))
		fd.Checkpoint = d.Checkpoint
		msg, err = contract.NewLifecycleMsg(w.cfg.Source, contract.Failed, fd, w.cfg.Now())
	}
	if err != nil {
		return nil, err
	}
	return &outcomeMsg{msg: msg, event: string(contract.Failed), class: string(f.class)}, nil
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

// publish sends msg and waits for the stream's ack, trying again on errors
// with doubling pauses. It gives up after publishAttempts tries or when the
// worker is forced to stop.
func (w *Worker) publish(msg *nats.Msg, event string) (*jetstream.PubAck, error) {
	pause := publishPause
	var err error
	for i := range publishAttempts {
		if i > 0 {
			w.m.publishRetries.WithLabelValues(event).Inc()
			select {
			case <-time.After(pause):
			case <-w.hardCtx.Done():
				return nil, fmt.Errorf("publish %s: %w (last error: %w)", event, w.hardCtx.Err(), err)
			}
			pause *= 2
		}
		ctx, cancel := context.WithTimeout(w.hardCtx, publishTimeout)
		ack, pubErr := w.cfg.JS.PublishMsg(ctx, msg)
		cancel()
		if pubErr == nil {
			return ack, nil
		}
		err = pubErr
	}
	return nil, fmt.Errorf("publish %s: %w", event, err)
}

// publishOutcome publishes out for the attempt of data. A failed or held
// fact is kept until the scheduler's decision is seen (see pendingSet),
// with its subscription in place before the publish.
func (w *Worker) publishOutcome(data contract.JobData, out *outcomeMsg) error {
	var kept *pendingFact
	if ev := contract.Lifecycle(out.event); w.pending != nil && (ev == contract.Failed || ev == contract.Held) {
		kept = w.pending.track(data.ID, data.Attempt, ev)
	}
	ack, err := w.publish(out.msg, out.event)
	if kept != nil {
		if err != nil {
			w.pending.abandon(kept)
		} else {
			w.pending.published(kept, out.msg, ack.Sequence)
		}
	}
	return err
}
