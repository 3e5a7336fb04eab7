package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/errclass"
)

// ClassBackoff gives one error class its own backoff, because one curve
// rarely fits every failure: rate limits should wait long, network errors
// little, and a timeout may be retried at once the first time. Fields left nil keep the policy's.
type ClassBackoff struct {
	Base       *time.Duration
	Max        *time.Duration
	Multiplier *float64
	Jitter     *backoff.Jitter
	JitterMax  *time.Duration
	// FirstDelay, when set, is the delay of the class's first retry,
	// exactly, without jitter (0: at once); later retries follow the
	// curve from its second step.
	FirstDelay *time.Duration
}

// BackoffFor returns the backoff of errors of class c: the policy's, with
// c's overrides applied, and the overrides (nil when c has none).
func (p Policy) BackoffFor(c errclass.Class) (backoff.Config, *ClassBackoff) {
	cfg := p.Backoff
	cb, ok := p.ClassBackoff[c]
	if !ok {
		return cfg, nil
	}
	if cb.Base != nil {
		cfg.Base = *cb.Base
	}
	if cb.Max != nil {
		cfg.Max = *cb.Max
	}
	if cb.Multiplier != nil {
		cfg.Multiplier = *cb.Multiplier
	}
	if cb.Jitter != nil {
		cfg.Jitter = *cb.Jitter
	}
	if cb.JitterMax != nil {
		cfg.JitterMax = *cb.JitterMax
	}
	return cfg, &cb
}

// classDelay is the backoff delay of retry n (0-based) of an error of
// class c: its base before jitter and the delay drawn.
func (p Policy) classDelay(c errclass.Class, n int, r backoff.Rand) (base, delay time.Duration, cb *ClassBackoff) {
	cfg, cb := p.BackoffFor(c)
	if cb != nil && cb.FirstDelay != nil && n == 0 {
		return *cb.FirstDelay, *cb.FirstDelay, cb
	}
	delay, _ = cfg.Delay(n, r)
	return cfg.BaseDelay(n), delay, cb
}

// validateClassBackoff checks every class's backoff as it applies: the
// policy's with the class's overrides. Fields are named
// class_backoff.<class>.<column>.
func (p Policy) validateClassBackoff() error {
	classes := make([]errclass.Class, 0, len(p.ClassBackoff))
	for c := range p.ClassBackoff {
		classes = append(classes, c)
	}
	slices.Sort(classes)
	for _, c := range classes {
		field := "class_backoff." + string(c)
		if !c.Valid() {
			return invalid("class_backoff", fmt.Sprintf("%q is not an error class", c))
		}
		cfg, cb := p.BackoffFor(c)
		switch {
		case cfg.Base < 0:
			return invalid(field+".base_delay_ms", fmt.Sprintf("must not be negative, got %d", cfg.Base.Milliseconds()))
		case cfg.Max < cfg.Base:
			return invalid(field+".max_delay_ms", fmt.Sprintf("must be at least the base delay (%d), got %d", cfg.Base.Milliseconds(), cfg.Max.Milliseconds()))
		case cfg.Max > MaxDelay:
			return invalid(field+".max_delay_ms", fmt.Sprintf("must be at most %d (366 days), got %d", MaxDelay.Milliseconds(), cfg.Max.Milliseconds()))
		case cfg.Multiplier < 1 || cfg.Multiplier != cfg.Multiplier:
			return invalid(field+".multiplier", fmt.Sprintf("must be a number >= 1, got %v", cfg.Multiplier))
		case !cfg.Jitter.Valid():
			return invalid(field+".jitter", fmt.Sprintf("%q must be none, full, equal or additive", cfg.Jitter))
		case cfg.JitterMax < 0 || cfg.JitterMax > MaxDelay:
			return invalid(field+".jitter_ms", fmt.Sprintf("must be between 0 and %d, got %d", MaxDelay.Milliseconds(), cfg.JitterMax.Milliseconds()))
		case cb.FirstDelay != nil && (*cb.FirstDelay < 0 || *cb.FirstDelay > MaxDelay):
			return invalid(field+".first_delay_ms", fmt.Sprintf("must be between 0 and %d, got %d", MaxDelay.Milliseconds(), cb.FirstDelay.Milliseconds()))
		}
	}
	return nil
}
