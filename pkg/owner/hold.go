package owner

import (
	"errors"
	"fmt"
	"time"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// MaxHoldAfter is the longest a handler may hold its item in one go: the
// contract's bound on retry-after hints and on a policy's max_hold (366
// days). A longer hold could never be honoured, since the scheduler ends
// every stretch of holds at the policy's max_hold anyway.
const MaxHoldAfter = contract.MaxRetryAfter

// HoldError is what a handler returns, built with Hold, to hold its item
// back instead of failing it: the attempt waited for permission (a
// downstream API said "not now", a per-tenant cap, a maintenance window)
// and nothing failed. The owner publishes retry.<kind>.held.<id> for the
// attempt instead of retry.<kind>.failed.<id>; the scheduler keeps the
// retry budget as it was and makes the item due again After from now,
// uncapped by the policy's max delay, or ends it as exhausted
// (hold_expired) once it has been held for longer than the policy's
// max_hold.
//
// A *HoldError anywhere in the error chain makes the attempt a hold, so
// fmt.Errorf("tenant busy: %w", owner.Hold(...)) holds too.
type HoldError struct {
	// After is how long from now the item waits; more than 0 and at most
	// MaxHoldAfter.
	After time.Duration
	// Detail says why, for operators (the held event's detail, shown in
	// the retry history). It is cut to contract.MaxMessageLen bytes.
	Detail string
	// Reason is contract.HoldThrottle (empty means that),
	// contract.HoldConcurrency or contract.HoldPause.
	Reason string
	// Key, when set, lets a released fact on retry.<kind>.released.<key>
	// lift the hold early (e.g. a tenant id when the tenant's cap frees
	// up). It is an id: 1-128 characters of [A-Za-z0-9_-].
	Key string
}

func (e *HoldError) Error() string {
	msg := "hold for " + e.After.String()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// HoldReason is the hold's reason with the default applied.
func (e *HoldError) HoldReason() string {
	if e.Reason == "" {
		return contract.HoldThrottle
	}
	return e.Reason
}

// Validate checks what the handler asked for. Owners check again before
// publishing, since a HoldError can be built by hand.
func (e *HoldError) Validate() error {
	switch {
	case e.After <= 0:
		return holdFieldErr("after", fmt.Sprintf("must be more than 0, got %s", e.After))
	case e.After > MaxHoldAfter:
		return holdFieldErr("after", fmt.Sprintf("must be at most %s (366 days), got %s", MaxHoldAfter, e.After))
	}
	switch e.HoldReason() {
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
// (retry.<kind>.released.<key>, contract.ReleasedData) makes the item due
// at once, before After has passed.
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

// Hold returns the error a handler returns to hold its item for after
// instead of failing it (see HoldError):
//
//	if !limiter.Allow(tenant) {
//		return owner.Hold(limiter.Wait(tenant), "tenant "+tenant+" is at its rate limit")
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
	if err := h.Validate(); err != nil {
		return errclass.Wrap(errclass.Temporary, fmt.Errorf("hold: %w", err))
	}
	return h
}

// AsHold returns the *HoldError in err's chain, if there is one: how a
// test of a handler checks that it held its item.
func AsHold(err error) (*HoldError, bool) {
	return errors.AsType[*HoldError](err)
}
