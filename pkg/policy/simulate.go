package policy

import (
	"math"
	"time"

	"github.com/retryd/retryd/pkg/errclass"
)

// MaxSimulatedRetries bounds Simulate's output.
const MaxSimulatedRetries = MaxMaxRetries

// Step is one retry of a simulated schedule.
type Step struct {
	// Retry is 1 for the first retry; Attempt is the attempt it runs as
	// (Retry+1).
	Retry   int
	Attempt int
	// BaseDelay is the exponential step before jitter; MinDelay and
	// MaxDelay bound the delay once jitter is drawn.
	BaseDelay time.Duration
	MinDelay  time.Duration
	MaxDelay  time.Duration
	// CumulativeMin and CumulativeMax bound the time from the first failure
	// to this retry, assuming each attempt fails at once.
	CumulativeMin time.Duration
	CumulativeMax time.Duration
}

// Simulate returns the backoff schedule of the first retries retries
// (pass p.MaxRetries for the whole budget), at most MaxSimulatedRetries. It
// ignores Enabled, error classes and retry-after hints: it shows what the
// backoff alone does.
func Simulate(p Policy, retries int) []Step {
	return SimulateClass(p, "", retries)
}

// SimulateClass is Simulate for errors of class c: the class's own
// backoff when the policy gives it one (its first_delay included), the
// policy's otherwise.
func SimulateClass(p Policy, c errclass.Class, retries int) []Step {
	cfg, cb := p.BackoffFor(c)
	n := min(max(retries, 0), MaxSimulatedRetries)
	steps := make([]Step, 0, n)
	var cumMin, cumMax time.Duration
	for i := range n {
		lo, hi := cfg.Bounds(i)
		base := cfg.BaseDelay(i)
		if cb != nil && cb.FirstDelay != nil && i == 0 {
			lo, hi, base = *cb.FirstDelay, *cb.FirstDelay, *cb.FirstDelay
		}
		cumMin, cumMax = addSat(cumMin, lo), addSat(cumMax, hi)
		steps = append(steps, Step{
			Retry:         i + 1,
			Attempt:       i + 2,
			BaseDelay:     base,
			MinDelay:      lo,
			MaxDelay:      hi,
			CumulativeMin: cumMin,
			CumulativeMax: cumMax,
		})
	}
	return steps
}

func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
