package policy_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

func TestDecideHold(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	since := failedAt.Add(-time.Hour)
	tests := []struct {
		name   string
		policy func(*policy.Policy)
		in     policy.Input
		// want: retry at failedAt+delay decided by decidedBy, or exhausted
		// when decidedBy is "".
		delay     time.Duration
		decidedBy string
		cappedBy  string
		retries   int
	}{
		{
			name:  "throttle at the window end, however long, budget untouched",
			in:    policy.Input{Attempt: 7, RetryCount: 2, Hold: &policy.Hold{Reason: contract.HoldThrottle, Until: failedAt.Add(10 * time.Minute)}},
			delay: 10 * time.Minute, decidedBy: contract.DecidedByHold, retries: 2,
		},
		{
			name:  "pause until T past the max delay and the budget",
			in:    policy.Input{Attempt: 21, RetryCount: 3, Hold: &policy.Hold{Reason: contract.HoldPause, Until: failedAt.Add(8 * day), Since: since}},
			delay: 8 * day, decidedBy: contract.DecidedByPauseUntil, retries: 3,
		},
		{
			name:  "due at until exactly; the delay in ms rounds up",
			in:    policy.Input{Attempt: 1, Hold: &policy.Hold{Reason: contract.HoldPause, Until: failedAt.Add(1500 * time.Microsecond)}},
			delay: 1500 * time.Microsecond, decidedBy: contract.DecidedByPauseUntil,
		},
		{
			name:  "until in the past releases at once",
			in:    policy.Input{Attempt: 1, Hold: &policy.Hold{Reason: contract.HoldThrottle, Until: failedAt.Add(-time.Second)}},
			delay: 0, decidedBy: contract.DecidedByHold,
		},
		{
			name:  "pause without end waits until max_hold",
			in:    policy.Input{Attempt: 2, Hold: &policy.Hold{Reason: contract.HoldPause, Since: since}},
			delay: 30*day - time.Hour, decidedBy: contract.DecidedByPause,
		},
		{
			name:  "released before it was applied",
			in:    policy.Input{Attempt: 2, Hold: &policy.Hold{Reason: contract.HoldPause, Since: since, Released: true}},
			delay: 0, decidedBy: contract.DecidedByResume,
		},
		{
			name:  "concurrency without a time polls at the backoff delay",
			in:    policy.Input{Attempt: 4, RetryCount: 2, Hold: &policy.Hold{Reason: contract.HoldConcurrency}},
			delay: 4 * time.Second, decidedBy: contract.DecidedByHold, retries: 2,
		},
		{
			name:   "until past max_hold is brought forward to it",
			policy: func(p *policy.Policy) { p.MaxHold = 2 * time.Hour },
			in:     policy.Input{Attempt: 3, Hold: &policy.Hold{Reason: contract.HoldPause, Until: failedAt.Add(5 * time.Hour), Since: since}},
			delay:  time.Hour, decidedBy: contract.DecidedByPauseUntil, cappedBy: contract.CappedByMaxHold,
		},
		{
			name:    "held for max_hold: hold_expired",
			policy:  func(p *policy.Policy) { p.MaxHold = time.Hour },
			in:      policy.Input{Attempt: 3, RetryCount: 1, Hold: &policy.Hold{Reason: contract.HoldPause, Since: since}},
			retries: 1,
		},
		{
			name:   "retries disabled and budget spent do not end a hold",
			policy: func(p *policy.Policy) { p.Enabled = false },
			in:     policy.Input{Attempt: 9, RetryCount: 3, RetryEnabledOverride: new(false), Hold: &policy.Hold{Reason: contract.HoldThrottle, Until: failedAt.Add(time.Second)}},
			delay:  time.Second, decidedBy: contract.DecidedByHold, retries: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := decide(tt.policy, tt.in, fixedRand(0))
			d := got.Decision
			require.Equal(t, tt.in.Hold.Reason, d.HoldReason)
			require.Equal(t, tt.retries, d.RetryCount, "a hold uses no retry")
			require.Equal(t, seedWith(tt.policy).EffectiveMaxHold().Milliseconds(), d.MaxHoldMS)
			require.NotNil(t, d.HeldSince)
			if tt.decidedBy == "" {
				require.False(t, got.Retry)
				require.Equal(t, contract.ExhaustedHoldExpired, got.ExhaustedReason)
				require.Contains(t, d.Note, "max_hold")
				return
			}
			require.True(t, got.Retry, d.Note)
			require.Equal(t, tt.in.Attempt+1, got.NextAttempt)
			require.Equal(t, failedAt.Add(tt.delay), got.NextAttemptAt)
			require.Equal(t, int64((tt.delay+time.Millisecond-1)/time.Millisecond), d.DelayMS)
			require.Equal(t, d.BaseDelayMS+d.JitterMS, d.DelayMS)
			require.Equal(t, tt.decidedBy, d.DecidedBy)
			require.Equal(t, tt.cappedBy, d.CappedBy)
		})
	}
}

// Whatever the policy, a hold keeps the budget, is never due before its
// Until nor after max_hold, and ends only by max_hold.
func TestDecideHoldProperties(t *testing.T) {
	t.Parallel()
	gen := rand.New(rand.NewPCG(13, 14))
	reasons := []string{contract.HoldThrottle, contract.HoldPause, contract.HoldConcurrency}
	for range 5000 {
		p := seedDefault()
		p.MaxRetries = gen.IntN(5)
		p.Enabled = gen.IntN(2) == 0
		p.Backoff.Max = time.Duration(gen.Int64N(int64(time.Second))) + p.Backoff.Base
		p.MaxHold = time.Duration(gen.Int64N(int64(60*24*time.Hour))) + time.Millisecond
		h := policy.Hold{Reason: reasons[gen.IntN(len(reasons))], Since: failedAt.Add(-time.Duration(gen.Int64N(int64(60 * 24 * time.Hour))))}
		if gen.IntN(2) == 0 {
			h.Until = failedAt.Add(time.Duration(gen.Int64N(int64(90*24*time.Hour))) - time.Hour)
		}
		in := policy.Input{Attempt: gen.IntN(100) + 1, RetryCount: gen.IntN(10), FailedAt: failedAt, Class: errclass.RateLimit, Hold: &h}
		o := policy.Decide(p, in, gen)
		expires := h.Since.Add(p.MaxHold)
		require.Equal(t, in.RetryCount, o.Decision.RetryCount)
		if !o.Retry {
			require.Equal(t, contract.ExhaustedHoldExpired, o.ExhaustedReason)
			require.False(t, failedAt.Before(expires))
			continue
		}
		require.True(t, failedAt.Before(expires))
		require.False(t, o.NextAttemptAt.Before(failedAt))
		require.Less(t, o.NextAttemptAt.Sub(expires), time.Millisecond, "never past max_hold")
		if !h.Until.IsZero() && o.Decision.CappedBy == "" {
			require.False(t, o.NextAttemptAt.Before(h.Until), "never before until")
		}
	}
}
