package owner

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// Item is one attempt of an item an owner runs: what the first delivery
// or the due event carries. The overrides (MaxRetries, RetryEnabled,
// TimeoutMS, Priority) and JobType travel with the item's facts, so the
// scheduler's decision and the next due see them again.
type Item struct {
	Kind    string
	ID      string
	Attempt int
	// Payload is the item's input, as the first delivery carried it.
	Payload json.RawMessage
	// Checkpoint is where the last attempt got to. A handler that made
	// progress sets it before it returns an error: the failure (or hold)
	// reports it, and the next due hands it back.
	Checkpoint json.RawMessage
	Metadata   map[string]string

	JobType      string
	MaxRetries   *int
	RetryEnabled *bool
	TimeoutMS    int64
	Priority     contract.Priority

	// started is the checkpoint the attempt started from: reported
	// instead of a new one too large to fit the fact.
	started json.RawMessage
}

// IdempotencyKey is "<id>:<attempt>": the same for every delivery of one
// attempt, so an effect keyed by it is applied once even when a crash
// makes the attempt run again.
func (it *Item) IdempotencyKey() string { return fmt.Sprintf("%s:%d", it.ID, it.Attempt) }

// ItemFromDue is the item a due event asks to run.
func ItemFromDue(d *contract.DueData) *Item {
	return &Item{
		Kind: d.Kind, ID: d.ID, Attempt: d.Attempt,
		Payload: d.Payload, Checkpoint: d.Checkpoint, Metadata: d.Metadata,
		JobType: d.JobType, MaxRetries: d.MaxRetries, RetryEnabled: d.RetryEnabled,
		TimeoutMS: d.TimeoutMS, Priority: d.Priority,
		started: d.Checkpoint,
	}
}

// Failure is what a failed fact reports about an error.
type Failure struct {
	Class        errclass.Class
	Message      string
	RetryAfter   *contract.RetryAfter
	NonRetryable bool
}

// Classify maps a handler's error to what the failed fact reports: an
// *errclass.Error's class, hint and flag, else c's classification of the
// message. A *HoldError built by hand with values the scheduler cannot
// honour is a bug in the handler, reported as a temporary failure that
// says so.
func Classify(err error, c *errclass.Classifier) Failure {
	if h, ok := AsHold(err); ok {
		if verr := h.Validate(); verr != nil {
			return Failure{Class: errclass.Temporary, Message: fmt.Errorf("hold: %w", verr).Error()}
		}
	}
	f := Failure{Message: err.Error()}
	if e, ok := errclass.As(err); ok {
		f.Class = e.Class
		f.NonRetryable = e.NonRetryable
		if e.RetryAfter > 0 {
			f.RetryAfter = contract.RetryAfterDuration(e.RetryAfter)
		}
	}
	if f.Class == "" && c != nil {
		class, hint := c.Classify(err)
		f.Class = class
		if f.RetryAfter == nil && hint > 0 {
			f.RetryAfter = contract.RetryAfterDuration(hint)
		}
	}
	if f.Class == "" {
		f.Class = errclass.Unknown
	}
	return f
}

// Facts builds the lifecycle facts an owner reports for its items.
type Facts struct {
	// Source is the CloudEvents source of every fact.
	Source string
	// Executor names the instance that ran the attempt (field executor).
	Executor string
	Now      func() time.Time
	Logger   *slog.Logger
}

// Succeeded is retry.<kind>.succeeded.<id> for it's attempt.
func (b Facts) Succeeded(it *Item) (*nats.Msg, error) {
	return contract.NewLifecycleMsg(b.Source, contract.Succeeded, contract.SucceededData{
		Kind: it.Kind, ID: it.ID, Attempt: it.Attempt, Metadata: it.Metadata, Executor: b.Executor,
	}, b.Now())
}

// Failed is retry.<kind>.failed.<id> for it's attempt, with f and what the
// scheduler hands back on the due: payload, checkpoint, metadata and the
// overrides.
func (b Facts) Failed(it *Item, f Failure) (*nats.Msg, error) {
	fd := contract.FailedData{
		Kind: it.Kind, ID: it.ID, Attempt: it.Attempt,
		Error:      contract.ErrorInfo{Class: string(f.Class), Message: Reportable(f.Message), NonRetryable: f.NonRetryable},
		RetryAfter: f.RetryAfter,
		JobType:    it.JobType, MaxRetries: it.MaxRetries, RetryEnabled: it.RetryEnabled, TimeoutMS: it.TimeoutMS, Priority: it.Priority,
		Payload: it.Payload, Checkpoint: it.Checkpoint, Metadata: it.Metadata,
		Executor: b.Executor,
	}
	msg, err := contract.NewLifecycleMsg(b.Source, contract.Failed, fd, b.Now())
	if b.tooLarge(err, it) {
		fd.Checkpoint = it.started
		msg, err = contract.NewLifecycleMsg(b.Source, contract.Failed, fd, b.Now())
	}
	return msg, err
}

// Held is retry.<kind>.held.<id> for it's attempt, held as h asks. It
// carries what a failure would, since the scheduler hands it back on the
// due event.
func (b Facts) Held(it *Item, h *HoldError) (*nats.Msg, error) {
	now := b.Now()
	until := now.Add(h.After).UTC()
	hd := contract.HeldData{
		Kind: it.Kind, ID: it.ID, Attempt: it.Attempt,
		Reason: h.HoldReason(), Until: &until, HoldKey: h.Key, Detail: Reportable(h.Detail),
		JobType: it.JobType, Payload: it.Payload, Checkpoint: it.Checkpoint, Metadata: it.Metadata,
		MaxRetries: it.MaxRetries, RetryEnabled: it.RetryEnabled, TimeoutMS: it.TimeoutMS, Priority: it.Priority,
		Executor: b.Executor,
	}
	msg, err := contract.NewLifecycleMsg(b.Source, contract.Held, hd, now)
	if b.tooLarge(err, it) {
		hd.Checkpoint = it.started
		msg, err = contract.NewLifecycleMsg(b.Source, contract.Held, hd, now)
	}
	return msg, err
}

// tooLarge reports whether a fact failed to build only because the
// attempt's new checkpoint did not fit with the payload: the fact is then
// built with the checkpoint the attempt started from, which did fit.
func (b Facts) tooLarge(err error, it *Item) bool {
	if !errors.Is(err, contract.ErrTooLarge) || len(it.Checkpoint) == 0 {
		return false
	}
	if b.Logger != nil {
		b.Logger.Warn("checkpoint too large to report with the payload; keeping the previous one",
			slog.String("kind", it.Kind), slog.String("id", it.ID), slog.Int("checkpoint_bytes", len(it.Checkpoint)))
	}
	return true
}

// StartedFrom records the checkpoint an attempt of it starts from, for
// an item built by hand rather than by ItemFromDue.
func (it *Item) StartedFrom(checkpoint json.RawMessage) { it.started = checkpoint }

// Reportable makes s fit a message or detail field that the scheduler
// stores: valid UTF-8 (JSON would turn each bad byte into a 3-byte U+FFFD
// on the wire, past the decoder's length limit), no NUL (Postgres text
// cannot store it, so the decoder refuses it), at most
// contract.MaxMessageLen bytes, cut on a character boundary.
func Reportable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	n := contract.MaxMessageLen
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
