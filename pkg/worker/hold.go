package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// MaxHoldAfter is the longest a handler may hold its job in one go: the
// contract's bound on retry-after hints and on a policy's max_hold (366
// days). A longer hold could never be honoured, since the scheduler ends
// every stretch of holds at the policy's max_hold anyway.
const MaxHoldAfter = contract.MaxRetryAfter

// HoldError is what a handler returns, built with Hold, to hold its job
// back instead of failing it: the attempt waited for permission (a
// downstream API said "not now", a per-tenant cap, a maintenance window)
// and nothing failed. The worker publishes retry.job.held.<id> for the
// attempt instead of retry.job.failed.<id>; the scheduler keeps the retry
// budget as it was and runs the job again After from now, uncapped by the
// policy's max delay, or ends it as exhausted (hold_expired) once the job
// has been held for longer than the policy's max_hold.
//
// A *HoldError anywhere in the error chain makes the attempt a hold, so
// fmt.Errorf("tenant busy: %w", worker.Hold(...)) holds too.
type HoldError struct {
	// After is how long from now the job waits; more than 0 and at most
	// MaxHoldAfter.
	After time.Duration
	// Detail says why, for operators (the held event's detail, shown in
	// the retry history). It is cut to contract.MaxMessageLen bytes.
	Detail string
	// Reason is contract.HoldThrottle (empty means that),
	// contract.HoldConcurrency or contract.HoldPause.
	Reason string
	// Key, when set, lets a released fact on retry.job.released.<key>
	// lift the hold early (e.g. a tenant id when the tenant's cap frees
	// up). It is an id: 1-128 characters of [A-Za-z0-9_-].
	Key string
}

func (e *HoldError) Error() string {
	msg := "hold job for " + e.After.String()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// reason is the hold's reason with the default applied.
func (e *HoldError) reason() string {
	if e.Reason == "" {
		return contract.HoldThrottle
	}
	return e.Reason
}

// validate checks what the handler asked for; the worker checks again
// before publishing, since a HoldError can be built by hand.
func (e *HoldError) validate() error {
	switch {
	case e.After <= 0:
		return holdFieldErr("after", fmt.Sprintf("must be more than 0, got %s", e.After))
	case e.After > MaxHoldAfter:
		return holdFieldErr("after", fmt.Sprintf("must be at most %s (366 days), got %s", MaxHoldAfter, e.After))
	}
	switch e.reason() {
	case contract.HoldThrottle, contract.HoldConcurrency, contract.HoldPause:
	default:
		return holdFieldErr("reason", fmt.Sprintf("must be %s, %s or %s, got %q", contract.HoldThrottle, contract.HoldConcurrency, contract.HoldPause, e.Reason))
	}
	if e.Key != "" {
		if err := contract.ValidateID("key", e.Key); err != nil {
			return err
		}
	}
	return nil
}

func holdFieldErr(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// HoldOption sets an optional part of a hold.
type HoldOption func(*HoldError)

// WithHoldKey names the hold so that a released fact for the key
// (retry.job.released.<key>, contract.ReleasedData) makes the job due at
// once, before After has passed.
func WithHoldKey(key string) HoldOption {
	return func(e *HoldError) { e.Key = key }
}

// WithHoldReason sets the held event's reason: contract.HoldConcurrency
// for a concurrency cap (a release of "slot_freed" with Count 1 then lifts
// the hold that waited longest), contract.HoldPause for a pause or a
// maintenance window. The default is contract.HoldThrottle.
func WithHoldReason(reason string) HoldOption {
	return func(e *HoldError) { e.Reason = reason }
}

// Hold returns the error a handler returns to hold its job for after
// instead of failing it (see HoldError):
//
//	if !limiter.Allow(tenant) {
//		return worker.Hold(limiter.Wait(tenant), "tenant "+tenant+" is at its rate limit")
//	}
//
// Input it cannot honour (after not more than 0 or more than MaxHoldAfter,
// an unknown reason, a key that is not an id) gives an error that is not
// a *HoldError: it wraps contract.ErrInvalid, names the problem, and is
// reported as a failed attempt of class temporary, like a panic, since it
// is a bug in the handler and holding for a made-up time would hide it.
func Hold(after time.Duration, detail string, opts ...HoldOption) error {
	h := &HoldError{After: after, Detail: detail}
	for _, o := range opts {
		o(h)
	}
	if err := h.validate(); err != nil {
		return errclass.Wrap(errclass.Temporary, fmt.Errorf("hold job: %w", err))
	}
	return h
}

// AsHold returns the *HoldError in err's chain, if there is one: how a
// test of a handler checks that it held its job.
func AsHold(err error) (*HoldError, bool) {
	return errors.AsType[*HoldError](err)
}

// heldMsg is the held event of an attempt whose handler returned h. It
// carries what a failure would (payload, checkpoint, metadata and the
// job's overrides), since the scheduler hands them back on the due event.
func (w *Worker) heldMsg(d contract.JobData, checkpoint json.RawMessage, h *HoldError, log *slog.Logger) (*outcomeMsg, error) {
	now := w.cfg.Now()
	until := now.Add(h.After).UTC()
	hd := contract.HeldData{
		Kind:         contract.KindJob,
		ID:           d.ID,
		Attempt:      d.Attempt,
		Reason:       h.reason(),
		Until:        &until,
		HoldKey:      h.Key,
		Detail:       reportable(h.Detail),
		JobType:      d.JobType,
		Payload:      d.Payload,
		Checkpoint:   checkpoint,
		Metadata:     d.Metadata,
		MaxRetries:   d.MaxRetries,
		RetryEnabled: d.RetryEnabled,
		TimeoutMS:    d.TimeoutMS,
		Priority:     d.Priority,
		Executor:     w.cfg.ExecutorID,
	}
	msg, err := contract.NewLifecycleMsg(w.cfg.Source, contract.Held, hd, now)
	if errors.Is(err, contract.ErrTooLarge) && len(checkpoint) > 0 {
		// As for a failure: keep the checkpoint the attempt started from,
		// which did fit with the payload.
		log.Warn("checkpoint too large to report with the payload; keeping the previous one", slog.Int("checkpoint_bytes", len(checkpoint)))
		hd.Checkpoint = d.Checkpoint
		msg, err = contract.NewLifecycleMsg(w.cfg.Source, contract.Held, hd, now)
	}
	if err != nil {
		return nil, err // already "build held event: ..."
	}
	return &outcomeMsg{msg: msg, event: string(contract.Held), class: hd.Reason}, nil
}

// reportable makes s fit a message or detail field that the scheduler
// stores: valid UTF-8 (JSON would turn each bad byte into a 3-byte U+FFFD
// on the wire, past the decoder's length limit), no NUL (Postgres text
// cannot store it, so the decoder refuses it), at most
// contract.MaxMessageLen bytes.
func reportable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	return truncate(s, contract.MaxMessageLen)
}
