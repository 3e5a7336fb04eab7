package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

// classBackoffs is a policy whose classes each have their own curve: rate
// limits wait long, network errors little, a timeout is retried at once
// the first time.
func classBackoffs() policy.Policy {
	p := seedDefault()
	p.MaxRetries = 5
	p.ClassBackoff = map[errclass.Class]policy.ClassBackoff{
		errclass.RateLimit: {Base: new(time.Minute), Max: new(time.Hour), Jitter: new(backoff.JitterNone)},
		errclass.Network:   {Base: new(200 * time.Millisecond), Max: new(2 * time.Second), Multiplier: new(1.5), Jitter: new(backoff.JitterNone)},
		errclass.Timeout:   {FirstDelay: new(time.Duration(0))},
	}
	return p
}

// The per-class backoff table: each class's own curve, the first_delay of
// a timeout, and classes without an entry on the policy's backoff.
func TestDecidePerClassBackoff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		class     errclass.Class
		retry     int // retries used before this one
		delay     time.Duration
		base      time.Duration
		byClass   bool
		firstNote bool
	}{
		{errclass.RateLimit, 0, time.Minute, time.Minute, true, false},
		{errclass.RateLimit, 1, 2 * time.Minute, 2 * time.Minute, true, false},
		{errclass.RateLimit, 4, 16 * time.Minute, 16 * time.Minute, true, false},
		{errclass.Network, 0, 200 * time.Millisecond, 200 * time.Millisecond, true, false},
		{errclass.Network, 1, 300 * time.Millisecond, 300 * time.Millisecond, true, false},
		{errclass.Network, 4, 1012 * time.Millisecond, 1012 * time.Millisecond, true, false},
		// A timeout: at once the first time, then the policy's curve
		// (1s x2, jitter lowest) from its second step.
		{errclass.Timeout, 0, 0, 0, true, true},
		{errclass.Timeout, 1, 2 * time.Second, 2 * time.Second, true, false},
		{errclass.Timeout, 2, 4 * time.Second, 4 * time.Second, true, false},
		// No entry: the policy's backoff.
		{errclass.Temporary, 0, time.Second, time.Second, false, false},
		{errclass.Unknown, 1, 2 * time.Second, 2 * time.Second, false, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.class)+"/"+string(rune('0'+tt.retry)), func(t *testing.T) {
			t.Parallel()
			o := policy.Decide(classBackoffs(), policy.Input{Attempt: tt.retry + 1, RetryCount: tt.retry, FailedAt: failedAt, Class: tt.class}, fixedRand(0))
			require.True(t, o.Retry)
			d := o.Decision
			require.Equal(t, contract.DecidedByBackoff, d.DecidedBy)
			require.Equal(t, tt.delay.Milliseconds(), d.DelayMS)
			require.Equal(t, tt.base.Milliseconds(), d.BaseDelayMS)
			require.Equal(t, failedAt.Add(tt.delay), o.NextAttemptAt)
			require.Equal(t, tt.retry+1, d.RetryCount)
			if tt.byClass {
				require.Equal(t, string(tt.class), d.BackoffClass)
			} else {
				require.Empty(t, d.BackoffClass)
			}
			if tt.firstNote {
				require.Contains(t, d.Note, "first_delay")
			} else {
				require.Empty(t, d.Note)
			}
		})
	}
}

// A class's backoff does not change what a hint or a hold decides.
func TestClassBackoffLeavesHintsAndHoldsAlone(t *testing.T) {
	t.Parallel()
	p := classBackoffs()
	o := policy.Decide(p, policy.Input{Attempt: 1, FailedAt: failedAt, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(5 * time.Second)}, fixedRand(0))
	require.Equal(t, int64(5000), o.Decision.DelayMS)
	require.Equal(t, contract.DecidedByRetryAfter, o.Decision.DecidedBy)
	require.Empty(t, o.Decision.BackoffClass)
}

func TestSimulateClass(t *testing.T) {
	t.Parallel()
	p := classBackoffs()
	steps := policy.SimulateClass(p, errclass.Timeout, 3)
	require.Equal(t, time.Duration(0), steps[0].MaxDelay)
	require.Equal(t, 2*time.Second, steps[1].MinDelay)
	require.Equal(t, 3*time.Second, steps[1].MaxDelay, "jitter bounds of the policy")
	require.Equal(t, 2*time.Second, steps[1].CumulativeMin)
	steps = policy.SimulateClass(p, errclass.RateLimit, 2)
	require.Equal(t, []time.Duration{time.Minute, 2 * time.Minute}, []time.Duration{steps[0].MaxDelay, steps[1].MaxDelay})
	require.Equal(t, policy.Simulate(p, 4), policy.SimulateClass(p, errclass.Temporary, 4), "no entry: the policy's backoff")
}

func TestValidateClassBackoff(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		cb    map[errclass.Class]policy.ClassBackoff
		field string
	}{
		{"valid", classBackoffs().ClassBackoff, ""},
		{"unknown class", map[errclass.Class]policy.ClassBackoff{"slow": {}}, "class_backoff"},
		{"base above the policy's max", map[errclass.Class]policy.ClassBackoff{errclass.Network: {Base: new(time.Hour)}}, "class_backoff.network.max_delay_ms"},
		{"negative base", map[errclass.Class]policy.ClassBackoff{errclass.Network: {Base: new(-time.Second)}}, "class_backoff.network.base_delay_ms"},
		{"multiplier below 1", map[errclass.Class]policy.ClassBackoff{errclass.Timeout: {Multiplier: new(0.5)}}, "class_backoff.timeout.multiplier"},
		{"jitter mode", map[errclass.Class]policy.ClassBackoff{errclass.Timeout: {Jitter: new(backoff.Jitter("lots"))}}, "class_backoff.timeout.jitter"},
		{"negative first delay", map[errclass.Class]policy.ClassBackoff{errclass.Timeout: {FirstDelay: new(-time.Second)}}, "class_backoff.timeout.first_delay_ms"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			requireField(t, seedWith(func(p *policy.Policy) { p.ClassBackoff = tt.cb }).Validate(), tt.field)
		})
	}
}
