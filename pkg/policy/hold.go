package policy

import (
	"fmt"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
)

// decideHold decides for an item its owner held back. A hold is waiting
// for permission, not a failed attempt, so:
//
//   - it uses no retry: Decision.RetryCount stays in.RetryCount, and the
//     enabled flag, the classes and max retries do not apply;
//   - it is not capped by the backoff's max delay: the item is due at
//     in.Hold.Until, whenever that is;
//   - once it has been held for the policy's max_hold since in.Hold.Since,
//     it is exhausted as hold_expired; a release time past that limit is
//     brought forward to it (capped_by max_hold), so the owner looks once
//     more before the item expires.
//
// Without an Until, a pause waits for a release fact until max_hold
// (decided_by pause), and any other hold is looked at again after the
// backoff delay of the current retry (decided_by hold), without using it.
func decideHold(p Policy, in Input, r backoff.Rand) Outcome {
	h := *in.Hold
	since := h.Since
	if since.IsZero() || since.After(in.FailedAt) {
		since = in.FailedAt
	}
	used := max(in.RetryCount, 0)
	limit := p.EffectiveMaxHold()
	expires := since.Add(limit)
	sinceUTC := since.UTC()
	dec := contract.Decision{
		Policy:        p.Name,
		PolicyVersion: p.Version,
		RetryCount:    used,
		MaxRetries:    p.EffectiveMaxRetries(in.MaxRetriesOverride),
		HoldReason:    h.Reason,
		HeldSince:     &sinceUTC,
		MaxHoldMS:     delayMS(limit),
	}
	if !in.FailedAt.Before(expires) {
		dec.Note = fmt.Sprintf("held (%s) since %s, longer than the max_hold of %dms", h.Reason, sinceUTC.Format(time.RFC3339Nano), delayMS(limit))
		return Outcome{ExhaustedReason: contract.ExhaustedHoldExpired, Decision: dec}
	}

	var delay time.Duration
	base := time.Duration(-1)
	switch {
	case h.Released:
		dec.DecidedBy = contract.DecidedByResume
		dec.Note = "the hold was lifted before this hold was applied"
	case !h.Until.IsZero():
		delay = h.Until.Sub(in.FailedAt)
		dec.DecidedBy = contract.DecidedByHold
		if h.Reason == contract.HoldPause {
			dec.DecidedBy = contract.DecidedByPauseUntil
		}
	case h.Reason == contract.HoldPause:
		delay = ceilMS(expires.Sub(in.FailedAt))
		dec.DecidedBy = contract.DecidedByPause
		dec.Note = "paused without an end: held until the hold is released, or until max_hold"
	default:
		base = p.Backoff.BaseDelay(used)
		delay, _ = p.Backoff.Delay(used, r)
		dec.DecidedBy = contract.DecidedByHold
		dec.Note = "no release time given: looked at again after the backoff delay, which uses no retry"
	}
	delay = max(delay, 0)
	if in.FailedAt.Add(delay).After(expires) {
		delay = ceilMS(expires.Sub(in.FailedAt))
		base = -1
		if dec.DecidedBy != contract.DecidedByPause {
			dec.CappedBy = contract.CappedByMaxHold
			dec.Note = fmt.Sprintf("release time capped at the max_hold of %dms", delayMS(limit))
		}
	}
	dec.DelayMS = delayMS(ceilMS(delay))
	dec.BaseDelayMS = dec.DelayMS
	if base >= 0 {
		dec.BaseDelayMS = min(delayMS(base), dec.DelayMS)
	}
	dec.JitterMS = dec.DelayMS - dec.BaseDelayMS
	next := in.FailedAt.Add(time.Duration(dec.DelayMS) * time.Millisecond)
	if exact := in.FailedAt.Add(delay); !h.Until.IsZero() && !h.Released && dec.CappedBy == "" {
		// The owner's release time itself, not rounded: DelayMS is
		// rounded up, so it may say up to 1ms more.
		next = exact
	}
	return Outcome{
		Retry:         true,
		NextAttemptAt: next,
		NextAttempt:   in.Attempt + 1,
		Decision:      dec,
	}
}

// ceilMS rounds d up to whole milliseconds, so a release at a given time
// is never due before it.
func ceilMS(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}
