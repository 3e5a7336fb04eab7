package policy_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		mutate    func(*policy.Policy)
		wantField string
	}{
		{"default", func(*policy.Policy) {}, ""},
		{"kind and job type", func(p *policy.Policy) { p.Kind, p.JobType = "job", "linkedin_outreach" }, ""},
		{"custom kind", func(p *policy.Policy) { p.Kind = "webhook-delivery" }, ""},
		{"zero delays", func(p *policy.Policy) { p.Backoff.Base, p.Backoff.Max = 0, 0 }, ""},
		{"max retries 0", func(p *policy.Policy) { p.MaxRetries = 0 }, ""},
		{"max retries 1000", func(p *policy.Policy) { p.MaxRetries = 1000 }, ""},
		{"unknown is a listable class", func(p *policy.Policy) { p.NonRetryableClasses = []errclass.Class{errclass.Unknown} }, ""},
		{"disabled is valid", func(p *policy.Policy) { p.Enabled = false }, ""},
		{"empty kind", func(p *policy.Policy) { p.Kind = "" }, "kind"},
		{"bad kind", func(p *policy.Policy) { p.Kind = "Event.X" }, "kind"},
		{"bad job type", func(p *policy.Policy) { p.JobType = "a b" }, "job_type"},
		{"empty name", func(p *policy.Policy) { p.Name = "" }, "name"},
		{"long name", func(p *policy.Policy) { p.Name = string(make([]byte, 65)) }, "name"},
		{"version 0", func(p *policy.Policy) { p.Version = 0 }, "version"},
		{"negative max retries", func(p *policy.Policy) { p.MaxRetries = -1 }, "max_retries"},
		{"max retries over 1000", func(p *policy.Policy) { p.MaxRetries = 1001 }, "max_retries"},
		{"negative base", func(p *policy.Policy) { p.Backoff.Base = -time.Millisecond }, "base_delay_ms"},
		{"max below base", func(p *policy.Policy) { p.Backoff.Max = 500 * time.Millisecond }, "max_delay_ms"},
		{"max above 366 days", func(p *policy.Policy) { p.Backoff.Max = 367 * 24 * time.Hour }, "max_delay_ms"},
		{"multiplier below 1", func(p *policy.Policy) { p.Backoff.Multiplier = 0.5 }, "multiplier"},
		{"multiplier NaN", func(p *policy.Policy) { p.Backoff.Multiplier = math.NaN() }, "multiplier"},
		{"empty jitter", func(p *policy.Policy) { p.Backoff.Jitter = "" }, "jitter"},
		{"unknown jitter", func(p *policy.Policy) { p.Backoff.Jitter = "random" }, "jitter"},
		{"negative jitter", func(p *policy.Policy) { p.Backoff.JitterMax = -1 }, "jitter_ms"},
		{"unknown retryable class", func(p *policy.Policy) { p.RetryableClasses = []errclass.Class{"fatal"} }, "retryable_classes"},
		{"alias is not a class", func(p *policy.Policy) { p.NonRetryableClasses = []errclass.Class{"validation_error"} }, "non_retryable_classes"},
		{"class in both lists", func(p *policy.Policy) { p.RetryableClasses = []errclass.Class{errclass.Permission} }, "non_retryable_classes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			requireField(t, seedWith(tt.mutate).Validate(), tt.wantField)
		})
	}
}

func TestRetryableAndEffectiveMax(t *testing.T) {
	t.Parallel()
	p := policy.Policy{MaxRetries: 4, RetryableClasses: []errclass.Class{errclass.Validation}, NonRetryableClasses: []errclass.Class{errclass.Timeout}}
	require.True(t, p.Retryable(errclass.Validation))
	require.False(t, p.Retryable(errclass.Timeout))
	require.False(t, p.Retryable(errclass.Permission))
	require.True(t, p.Retryable(errclass.Network))
	require.True(t, p.Retryable(""))
	require.Equal(t, 4, p.EffectiveMaxRetries(nil))
	require.Equal(t, 0, p.EffectiveMaxRetries(new(0)))
	require.Equal(t, 9, p.EffectiveMaxRetries(new(9)))
	require.Equal(t, 0, p.EffectiveMaxRetries(new(-3)))
}

func TestSimulate(t *testing.T) {
	t.Parallel()
	p := seedDefault()
	p.Backoff = backoff.JobDefault()
	h, m := time.Hour, 5*time.Minute
	want := []policy.Step{
		{Retry: 1, Attempt: 2, BaseDelay: 2 * h, MinDelay: 2 * h, MaxDelay: 2*h + m, CumulativeMin: 2 * h, CumulativeMax: 2*h + m},
		{Retry: 2, Attempt: 3, BaseDelay: 4 * h, MinDelay: 4 * h, MaxDelay: 4*h + m, CumulativeMin: 6 * h, CumulativeMax: 6*h + 2*m},
		{Retry: 3, Attempt: 4, BaseDelay: 8 * h, MinDelay: 8 * h, MaxDelay: 8*h + m, CumulativeMin: 14 * h, CumulativeMax: 14*h + 3*m},
		{Retry: 4, Attempt: 5, BaseDelay: 16 * h, MinDelay: 16 * h, MaxDelay: 16*h + m, CumulativeMin: 30 * h, CumulativeMax: 30*h + 4*m},
		{Retry: 5, Attempt: 6, BaseDelay: 24 * h, MinDelay: 24 * h, MaxDelay: 24*h + m, CumulativeMin: 54 * h, CumulativeMax: 54*h + 5*m},
	}
	require.Equal(t, want, policy.Simulate(p, 5))

	p.Backoff.Jitter = backoff.JitterFull
	full := policy.Simulate(p, 2)
	require.Equal(t, policy.Step{Retry: 2, Attempt: 3, BaseDelay: 4 * h, MinDelay: 0, MaxDelay: 4 * h, CumulativeMin: 0, CumulativeMax: 6 * h}, full[1])

	p.Backoff.Jitter = backoff.JitterEqual
	equal := policy.Simulate(p, 1)
	require.Equal(t, policy.Step{Retry: 1, Attempt: 2, BaseDelay: 2 * h, MinDelay: h, MaxDelay: 2 * h, CumulativeMin: h, CumulativeMax: 2 * h}, equal[0])
}

func TestSimulateEdges(t *testing.T) {
	t.Parallel()
	p := seedDefault()
	require.Empty(t, policy.Simulate(p, 0))
	require.Empty(t, policy.Simulate(p, -3))
	long := policy.Simulate(p, math.MaxInt)
	require.Len(t, long, policy.MaxSimulatedRetries)
	last := long[len(long)-1]
	require.Equal(t, 5*time.Minute, last.BaseDelay)
	require.Equal(t, 5*time.Minute+time.Second, last.MaxDelay)

	p.Backoff = backoff.Config{Base: math.MaxInt64 / 2, Max: math.MaxInt64 / 2, Multiplier: 2, Jitter: backoff.JitterNone}
	saturated := policy.Simulate(p, 4)
	require.Equal(t, time.Duration(math.MaxInt64), saturated[3].CumulativeMax)
	require.Equal(t, time.Duration(math.MaxInt64), saturated[3].CumulativeMin)
}
