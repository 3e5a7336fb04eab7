package worker

import (
	"time"

	"github.com/retryd/retryd/pkg/owner"
)

// A job's hold is an owner's hold: the worker reports it through the same
// runtime as every owner (pkg/owner). These names keep the worker's API.

// MaxHoldAfter is the longest a handler may hold its job in one go.
const MaxHoldAfter = owner.MaxHoldAfter

// HoldError is what a handler returns, built with Hold, to hold its job
// back instead of failing it (see owner.HoldError): the worker publishes
// retry.job.held.<id> for the attempt, and the job keeps its retry budget.
type HoldError = owner.HoldError

// HoldOption sets an optional part of a hold.
type HoldOption = owner.HoldOption

// WithHoldKey names the hold so that a released fact for the key
// (retry.job.released.<key>) makes the job due at once.
func WithHoldKey(key string) HoldOption { return owner.WithHoldKey(key) }

// WithHoldReason sets the held event's reason (contract.HoldThrottle,
// HoldConcurrency or HoldPause).
func WithHoldReason(reason string) HoldOption { return owner.WithHoldReason(reason) }

// Hold returns the error a handler returns to hold its job for after
// instead of failing it:
//
//	if !limiter.Allow(tenant) {
//		return worker.Hold(limiter.Wait(tenant), "tenant "+tenant+" is at its rate limit")
//	}
//
// Input it cannot honour gives an error that is not a *HoldError and is
// reported as a failed attempt of class temporary (see owner.Hold).
func Hold(after time.Duration, detail string, opts ...HoldOption) error {
	return owner.Hold(after, detail, opts...)
}

// AsHold returns the *HoldError in err's chain, if there is one: how a
// test of a handler checks that it held its job.
func AsHold(err error) (*HoldError, bool) { return owner.AsHold(err) }
