// Package backoff computes retry delays: exponential growth from a base
// delay, capped at a maximum, with jitter so that items that failed together
// do not all come back together.
//
// Every function is pure apart from the random source, which callers inject
// (a seeded *math/rand/v2.Rand makes the output reproducible). Arithmetic is
// saturating: a retry number of a million or math.MaxInt yields Max, never an
// overflowed or negative delay.
package backoff

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Jitter selects how randomness is added to the exponential delay d.
type Jitter string

const (
	// JitterNone uses d as is.
	JitterNone Jitter = "none"
	// JitterFull draws uniformly from [0, d] (AWS "full jitter"): the best
	// spread, but a retry may come back almost at once.
	JitterFull Jitter = "full"
	// JitterEqual draws from [d/2, d]: half the delay is kept.
	JitterEqual Jitter = "equal"
	// JitterAdditive adds [0, JitterMax] on top of d, as the default
	// schedules do; the delay never falls below the exponential step.
	JitterAdditive Jitter = "additive"
)

// Valid reports whether j is one of the jitter modes. The empty string is
// valid and means JitterNone.
func (j Jitter) Valid() bool {
	switch j {
	case "", JitterNone, JitterFull, JitterEqual, JitterAdditive:
		return true
	}
	return false
}

// ErrInvalid is wrapped by every error of Config.Validate.
var ErrInvalid = errors.New("invalid backoff config")

// Config describes a backoff schedule. Retry n (0-based: 0 is the first
// retry) waits min(Base*Multiplier^n, Max), then jitter is applied.
type Config struct {
	// Base is the delay before the first retry.
	Base time.Duration
	// Max caps the exponential step (and the delay, except for the additive
	// jitter drawn on top of it).
	Max time.Duration
	// Multiplier is the growth factor per retry; values below 1 (or NaN)
	// are treated as 1 by the delay functions and rejected by Validate.
	Multiplier float64
	// Jitter is the jitter mode; empty means JitterNone.
	Jitter Jitter
	// JitterMax is the largest additive jitter; only JitterAdditive uses it.
	JitterMax time.Duration
}

// Default is the schedule used by the default policies for
// events, trigger deliveries and workflow steps: 1s, 2s, 4s ... capped at
// 5 minutes, plus up to 1s of jitter.
func Default() Config {
	return Config{Base: time.Second, Max: 5 * time.Minute, Multiplier: 2, Jitter: JitterAdditive, JitterMax: time.Second}
}

// JobDefault is the schedule of the default job policy, for jobs whose
// failures usually need a person or a provider to recover before a retry
// can work: 2h, 4h, 8h, 16h, then 24h, plus up to 5 minutes of jitter.
func JobDefault() Config {
	return Config{Base: 2 * time.Hour, Max: 24 * time.Hour, Multiplier: 2, Jitter: JitterAdditive, JitterMax: 5 * time.Minute}
}

// Validate checks the config; its errors wrap ErrInvalid and name the field.
func (c Config) Validate() error {
	switch {
	case c.Base < 0:
		return fmt.Errorf("%w: Config.Base must not be negative, got %s", ErrInvalid, c.Base)
	case c.Max < c.Base:
		return fmt.Errorf("%w: Config.Max (%s) must be at least Config.Base (%s)", ErrInvalid, c.Max, c.Base)
	case math.IsNaN(c.Multiplier) || math.IsInf(c.Multiplier, 0) || c.Multiplier < 1:
		return fmt.Errorf("%w: Config.Multiplier must be a finite number >= 1, got %v", ErrInvalid, c.Multiplier)
	case !c.Jitter.Valid():
		return fmt.Errorf("%w: Config.Jitter %q is not none, full, equal or additive", ErrInvalid, c.Jitter)
	case c.JitterMax < 0:
		return fmt.Errorf("%w: Config.JitterMax must not be negative, got %s", ErrInvalid, c.JitterMax)
	}
	return nil
}

// Rand is the source of jitter. *math/rand/v2.Rand satisfies it; a nil Rand
// means the package's goroutine-safe default source.
type Rand interface {
	// Int64N returns a number in [0, n); n is always > 0.
	Int64N(n int64) int64
}

type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// BaseDelay is the exponential step for retry (0-based), before jitter:
// Base*Multiplier^retry capped at Max. Negative retries count as 0.
func (c Config) BaseDelay(retry int) time.Duration {
	capD := max(c.Max, 0)
	base := max(c.Base, 0)
	if base >= capD {
		return capD
	}
	m := c.Multiplier
	if !(m > 1) { // also catches NaN
		return base
	}
	retry = max(retry, 0)
	// Pow overflows to +Inf for huge retries, which the cap absorbs; a
	// Duration conversion only happens below Max, so it cannot overflow.
	f := float64(base) * math.Pow(m, float64(retry))
	if math.IsNaN(f) || f >= float64(capD) {
		return capD
	}
	return time.Duration(math.Round(f))
}

// Bounds is the range Delay can return for retry: [0, d] for full jitter,
// [d - d/2, d] for equal, [d, d+JitterMax] for additive and [d, d] for none,
// where d is BaseDelay(retry).
func (c Config) Bounds(retry int) (lo, hi time.Duration) {
	d := c.BaseDelay(retry)
	switch c.Jitter {
	case JitterFull:
		return 0, d
	case JitterEqual:
		return d - d/2, d
	case JitterAdditive:
		return d, addSat(d, max(c.JitterMax, 0))
	}
	return d, d
}

// Delay is the wait before retry (0-based) with jitter drawn from r, and the
// jitter itself, signed so that delay == BaseDelay(retry) + jitter: zero or
// negative for full and equal jitter, zero or positive for additive. The
// delay stays within Bounds(retry), so it never exceeds Max, or
// Max+JitterMax for additive jitter.
func (c Config) Delay(retry int, r Rand) (delay, jitter time.Duration) {
	d := c.BaseDelay(retry)
	lo, hi := c.Bounds(retry)
	if hi <= lo {
		return lo, lo - d
	}
	if r == nil {
		r = globalRand{}
	}
	span := int64(hi - lo)
	var n int64
	if span == math.MaxInt64 {
		n = r.Int64N(span) // [0, span) rather than overflow span+1
	} else {
		n = r.Int64N(span + 1)
	}
	delay = lo + time.Duration(n)
	return delay, delay - d
}

// NextAttemptAt is now plus Delay(retry, r).
func (c Config) NextAttemptAt(now time.Time, retry int, r Rand) time.Time {
	d, _ := c.Delay(retry, r)
	return now.Add(d)
}

// addSat adds two non-negative durations, saturating at the largest
// Duration.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
