package policy

import (
	"fmt"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// Input is one failed attempt as the scheduler sees it.
type Input struct {
	// Attempt is the attempt that failed (1-based); Outcome.NextAttempt is
	// Attempt+1. The budget is counted by RetryCount, not Attempt, so a
	// manual retry that resets the budget keeps attempts growing.
	Attempt int
	// RetryCount is how many retries were already used; it is also the
	// 0-based backoff step of the retry being decided.
	RetryCount int
	FailedAt   time.Time
	// Class is the error class; empty counts as unknown.
	Class errclass.Class
	// NonRetryable is the owner's word that retrying cannot help
	// (errclass.NonRetryable); it stops retries whatever the class.
	NonRetryable bool
	// RetryAfter is the owner's hint for a failure; it replaces backoff and
	// jitter, capped at the policy's max_retry_after (not its max delay).
	RetryAfter *contract.RetryAfter
	// Hold, when set, makes this a hold rather than a failure: the owner
	// held attempt Attempt back (see decideHold). FailedAt is then when it
	// was held.
	Hold *Hold
	// MaxRetriesOverride and RetryEnabledOverride are the item's own
	// settings (failed event max_retries and retry_enabled).
	MaxRetriesOverride   *int
	RetryEnabledOverride *bool
}

// Hold is an item held back by its owner: waiting, not failing.
type Hold struct {
	// Reason is contract.HoldThrottle, HoldPause or HoldConcurrency.
	Reason string
	// Until is when the hold lifts by itself; zero when the owner does not
	// know (a pause without an end, a concurrency limit).
	Until time.Time
	// Since is when the item's current stretch of holds began; max_hold
	// counts from it. Zero means this hold begins it.
	Since time.Time
	// Released is set when a release fact (a resume) already lifted the
	// hold: the item is due at once.
	Released bool
}

// Outcome is the decision: retry at NextAttemptAt, or stop for
// ExhaustedReason (contract.ExhaustedMaxRetries, ExhaustedNonRetryable,
// ExhaustedRetriesDisabled or, for a hold, ExhaustedHoldExpired).
type Outcome struct {
	Retry           bool
	NextAttemptAt   time.Time
	NextAttempt     int
	ExhaustedReason string
	// Decision is what the scheduled/rescheduled event records; for an
	// exhausted outcome it has the policy, class and budget, an empty
	// DecidedBy and the reason spelled out in Note.
	Decision contract.Decision
}

// Decide applies the rules in order:
//
//  1. retries disabled by the policy or by the item => exhausted retries_disabled;
//  2. the item is marked non-retryable, or the policy does not retry its
//     class => exhausted non_retryable;
//  3. RetryCount >= max retries (the item's override wins) => exhausted max_retries;
//  4. otherwise retry after the retry-after hint capped at MaxRetryAfter
//     (decided_by retry_after, no jitter; capped_by max_retry_after when
//     the cap applies), or after the backoff delay of RetryCount for the
//     error's class (decided_by backoff; the class's own backoff when the
//     policy gives it one, recorded as backoff_class).
//
// A hold (in.Hold set) follows decideHold instead: none of these rules
// apply to it.
//
// Delays are whole milliseconds, so Decision.DelayMS equals
// BaseDelayMS + JitterMS and NextAttemptAt - FailedAt exactly. A nil r uses
// the package default random source.
func Decide(p Policy, in Input, r backoff.Rand) Outcome {
	if in.Hold != nil {
		return decideHold(p, in, r)
	}
	class := in.Class
	if class == "" {
		class = errclass.Unknown
	}
	used := max(in.RetryCount, 0)
	maxRetries := p.EffectiveMaxRetries(in.MaxRetriesOverride)
	dec := contract.Decision{
		Policy:        p.Name,
		PolicyVersion: p.Version,
		ErrorClass:    string(class),
		RetryCount:    used,
		MaxRetries:    maxRetries,
	}
	var hint time.Duration
	if in.RetryAfter != nil {
		hint = in.RetryAfter.Delay(in.FailedAt)
		ms := delayMS(hint)
		dec.RetryAfterMS = &ms
	}

	switch {
	case !p.Enabled:
		return exhausted(dec, contract.ExhaustedRetriesDisabled, fmt.Sprintf("retries are disabled by policy %s v%d", p.Name, p.Version))
	case in.RetryEnabledOverride != nil && !*in.RetryEnabledOverride:
		return exhausted(dec, contract.ExhaustedRetriesDisabled, "retries are disabled for this item (retry_enabled=false)")
	case in.NonRetryable:
		return exhausted(dec, contract.ExhaustedNonRetryable, "the owner marked the error non-retryable")
	case !p.Retryable(class):
		return exhausted(dec, contract.ExhaustedNonRetryable, fmt.Sprintf("class %s is not retried by policy %s v%d", class, p.Name, p.Version))
	case used >= maxRetries:
		return exhausted(dec, contract.ExhaustedMaxRetries, retriesUsed(used, maxRetries))
	}

	var base, delay time.Duration
	if in.RetryAfter != nil {
		// The owner knows when the dependency recovers; the backoff's max
		// delay is about guessing, so only max_retry_after bounds a hint.
		limit := p.EffectiveMaxRetryAfter()
		delay = min(max(hint, 0), limit)
		base = delay
		dec.DecidedBy = contract.DecidedByRetryAfter
		if hint > delay {
			dec.CappedBy = contract.CappedByMaxRetryAfter
			dec.Note = fmt.Sprintf("retry-after hint of %dms capped at the max_retry_after of %dms", delayMS(hint), delayMS(delay))
		}
	} else {
		var cb *ClassBackoff
		base, delay, cb = p.classDelay(class, used, r)
		dec.DecidedBy = contract.DecidedByBackoff
		if cb != nil {
			dec.BackoffClass = string(class)
			if cb.FirstDelay != nil && used == 0 {
				dec.Note = fmt.Sprintf("first retry of a %s error: its first_delay of %dms", class, delayMS(delay))
			}
		}
	}
	dec.BaseDelayMS = delayMS(base)
	dec.DelayMS = delayMS(delay)
	dec.JitterMS = dec.DelayMS - dec.BaseDelayMS
	dec.RetryCount = used + 1
	return Outcome{
		Retry:         true,
		NextAttemptAt: in.FailedAt.Add(time.Duration(dec.DelayMS) * time.Millisecond),
		NextAttempt:   in.Attempt + 1,
		Decision:      dec,
	}
}

func exhausted(dec contract.Decision, reason, note string) Outcome {
	dec.Note = note
	return Outcome{ExhaustedReason: reason, Decision: dec}
}

// retriesUsed says how much of the retry budget is used. A manual retry
// past the budget or a lowered max_retries leaves more used than allowed,
// and "8 of 3" would read as a counting error.
func retriesUsed(used, allowed int) string {
	if used > allowed {
		return fmt.Sprintf("%d retries used, over the %d allowed", used, allowed)
	}
	return fmt.Sprintf("%d of %d retries used", used, allowed)
}
